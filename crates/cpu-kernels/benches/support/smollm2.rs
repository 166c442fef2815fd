//! SmolLM2-135M's shapes, shared by the benches that run a decode step's products
//! (`kernels`' `q4_1_llama_30_layers_x1` and `matvec`'s `step_*` rows).

/// The seven weight matrices of one layer, `(k, m)`: Q, K, V, O (attention, 576 wide with
/// three KV heads of 64), gate, up and down (FFN, 1536 wide).
pub const LAYER_PRODUCTS: [(i64, i64); 7] = [
    (576, 576),
    (576, 192),
    (576, 192),
    (576, 576),
    (576, 1536),
    (576, 1536),
    (1536, 576),
];
