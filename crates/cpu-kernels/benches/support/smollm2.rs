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

/// Which input each of [`LAYER_PRODUCTS`] multiplies: Q, K and V the normed layer input (0),
/// O the attention's heads (1), gate and up the normed FFN input (2), down the activation (3).
#[allow(dead_code, reason = "not every bench uses it")]
pub const LAYER_INPUTS: [usize; 7] = [0, 0, 0, 1, 2, 2, 3];
