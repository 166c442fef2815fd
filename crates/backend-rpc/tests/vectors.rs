//! Byte-exact checks against the hex vectors and enum lists of `shared/spec/ggml-rpc.md`
//! (captured from a real ggml 0.25.3 rpc-server, protocol 7.0.0).

mod common;

use backend_rpc::mapping::{op_from_wire, op_to_wire, type_from_wire, unary_to_wire};
use backend_rpc::wire::{
    AllocBufferRequest, AllocBufferResponse, BufferGetBaseRequest, BufferGetBaseResponse, Command,
    GetTensorRequest, GraphMessage, HelloRequest, HelloResponse, PROTO_MAJOR, PROTO_MINOR,
    PROTO_PATCH, Payload, Request, RpcTensor, SetTensorRequest, TensorData, WireError, put_header,
};
use common::hex;
use graph::{ElementType, Op, UnaryOp};

const BUF: u64 = 0x5566_86fd_0760;
const BASE: u64 = 0x5566_86fc_ab00;

fn request(cmd: Command, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    put_header(&mut v, cmd, payload.len() as u64);
    v.extend_from_slice(payload);
    v
}

/// A typed request on the wire: header, then its payload.
fn typed<R: Request>(req: &R) -> Vec<u8> {
    request(R::COMMAND, &req.to_bytes())
}

/// A response payload after its 8-byte size, checking the size.
fn answer(framed: &[u8]) -> &[u8] {
    let (size, payload) = framed.split_at(8);
    assert_eq!(
        u64::from_le_bytes(size.try_into().unwrap()),
        payload.len() as u64
    );
    payload
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Vector A's tensors a (id 1), b (id 2), out = a + b (id 3): 4 x f32 at base+0/32/64.
fn vec_a_tensor(id: u64) -> RpcTensor {
    let mut t = RpcTensor {
        id,
        ty: 0,
        buffer: BUF,
        ne: [4, 1, 1, 1],
        nb: [4, 16, 16, 16],
        data: BASE + 32 * (id - 1),
        ..Default::default()
    };
    t.set_name(["a", "b", "out"][id as usize - 1]);
    if id == 3 {
        t.op = 2;
        t.flags = 18;
        t.src[0] = 1;
        t.src[1] = 2;
    }
    t
}

#[test]
fn hello_request_and_response() {
    let req = typed(&HelloRequest::default());
    assert_eq!(
        req,
        hex("0000: 0e 18 00 00 00 00 00 00 00 00 00 00 00 00 00 00
             0010: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
             0020: 00")
    );
    assert_eq!(
        HelloRequest::decode(&req[9..]).unwrap(),
        HelloRequest::default()
    );
    // ggml's answer (36 bytes with the size prefix); backend-rpc-server's tests/vectors.rs
    // checks that our server answers exactly this.
    let resp = hex("0000: 1c 00 00 00 00 00 00 00 07 00 00 00 00 00 00 00
                    0010: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
                    0020: 00 00 00 00");
    let ours = HelloResponse {
        major: PROTO_MAJOR,
        minor: PROTO_MINOR,
        patch: PROTO_PATCH,
        caps: [0; 24],
    };
    assert_eq!(HelloResponse::decode(answer(&resp)).unwrap(), ours);
    assert_eq!(ours.to_bytes(), answer(&resp));
}

#[test]
fn alloc_and_get_base_requests() {
    let alloc = AllocBufferRequest {
        device: 0,
        size: 96,
    };
    let req = typed(&alloc);
    assert_eq!(
        req,
        hex("0000: 00 0c 00 00 00 00 00 00 00 00 00 00 00 60 00 00
             0010: 00 00 00 00 00")
    );
    assert_eq!(AllocBufferRequest::decode(&req[9..]).unwrap(), alloc);
    let resp = hex("0000: 10 00 00 00 00 00 00 00 60 07 fd 86 66 55 00 00
                    0010: 60 00 00 00 00 00 00 00");
    let got = AllocBufferResponse {
        remote_ptr: BUF,
        remote_size: 96,
    };
    assert_eq!(AllocBufferResponse::decode(answer(&resp)).unwrap(), got);
    assert_eq!(got.to_bytes(), answer(&resp));

    let base = BufferGetBaseRequest { remote_ptr: BUF };
    let req = typed(&base);
    assert_eq!(
        req,
        hex("0000: 03 08 00 00 00 00 00 00 00 60 07 fd 86 66 55 00
             0010: 00")
    );
    assert_eq!(BufferGetBaseRequest::decode(&req[9..]).unwrap(), base);
    let resp = hex("0000: 08 00 00 00 00 00 00 00 00 ab fc 86 66 55 00 00");
    let got = BufferGetBaseResponse { base_ptr: BASE };
    assert_eq!(BufferGetBaseResponse::decode(answer(&resp)).unwrap(), got);
    assert_eq!(got.to_bytes(), answer(&resp));

    // Vector B's ALLOC_BUFFER of 114688 bytes, and its answer.
    let alloc = AllocBufferRequest {
        device: 0,
        size: 114688,
    };
    assert_eq!(
        typed(&alloc),
        hex("0000: 00 0c 00 00 00 00 00 00 00 00 00 00 00 00 c0 01
             0010: 00 00 00 00 00")
    );
    let resp = hex("0000: 10 00 00 00 00 00 00 00 60 07 fd 86 66 55 00 00
                    0010: 00 c0 01 00 00 00 00 00");
    let got = AllocBufferResponse {
        remote_ptr: BUF,
        remote_size: 114688,
    };
    assert_eq!(AllocBufferResponse::decode(answer(&resp)).unwrap(), got);
}

const SET_A_320: &str = "
0000: 06 41 01 00 00 00 00 00 00 01 00 00 00 00 00 00
0010: 00 00 00 00 00 60 07 fd 86 66 55 00 00 04 00 00
0020: 00 01 00 00 00 01 00 00 00 01 00 00 00 04 00 00
0030: 00 10 00 00 00 10 00 00 00 10 00 00 00 00 00 00
0040: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0050: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0060: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0070: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0080: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0090: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00a0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00b0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00c0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00d0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00e0: 00 00 00 00 00 00 ab fc 86 66 55 00 00 61 00 00
00f0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0100: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0110: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0120: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0130: 00 00 00 00 00 00 00 00 00 00 00 00 80 3f 00 00";

#[test]
fn set_tensor_request() {
    let set = SetTensorRequest {
        tensor: vec_a_tensor(1),
        cache: false,
        offset: 0,
    };
    let mut p = set.to_bytes();
    p.extend_from_slice(&f32s(&[1.0, 2.0, 3.0, 4.0]));
    let req = request(Command::SetTensor, &p);
    assert_eq!(req.len(), 330);
    assert_eq!(req[..320], hex(SET_A_320)[..]);
    // Field offsets from the spec's table.
    assert_eq!(req[305], 0); // cache flag
    assert_eq!(req[306..314], [0u8; 8]); // offset
    assert_eq!(&req[314..330], &f32s(&[1.0, 2.0, 3.0, 4.0])[..]);
    assert_eq!(RpcTensor::decode(&req[9..]).unwrap(), vec_a_tensor(1));
    let (got, data) = SetTensorRequest::split(&req[9..]).unwrap();
    assert_eq!(got, set);
    assert_eq!(data, f32s(&[1.0, 2.0, 3.0, 4.0]));
}

const GRAPH_A_320: &str = "
0000: 0a 8c 03 00 00 00 00 00 00 00 00 00 00 01 00 00
0010: 00 03 00 00 00 00 00 00 00 03 00 00 00 01 00 00
0020: 00 00 00 00 00 00 00 00 00 60 07 fd 86 66 55 00
0030: 00 04 00 00 00 01 00 00 00 01 00 00 00 01 00 00
0040: 00 04 00 00 00 10 00 00 00 10 00 00 00 10 00 00
0050: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0060: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0070: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0080: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0090: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00a0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00b0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00c0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00d0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00e0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00f0: 00 00 00 00 00 00 00 00 00 00 ab fc 86 66 55 00
0100: 00 61 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0110: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0120: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0130: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00";

#[test]
fn graph_compute_request() {
    let g = GraphMessage {
        device: 0,
        nodes: vec![3],
        tensors: vec![vec_a_tensor(1), vec_a_tensor(2), vec_a_tensor(3)],
    };
    let req = request(Command::GraphCompute, &g.encode());
    assert_eq!(req.len(), 917);
    assert_eq!(req[..320], hex(GRAPH_A_320)[..]);
    // Spot checks from the field table: out's op at 673, flags at 741, src at 745, name at 849.
    assert_eq!(req[673..677], 2u32.to_le_bytes());
    assert_eq!(req[741..745], 18i32.to_le_bytes());
    assert_eq!(req[745..753], 1u64.to_le_bytes());
    assert_eq!(req[753..761], 2u64.to_le_bytes());
    assert_eq!(&req[849..852], b"out");
    assert_eq!(req[841..849], 0x5566_86fc_ab40u64.to_le_bytes());
    assert_eq!(GraphMessage::decode(&req[9..], 16, 16).unwrap(), g);
    // Truncated or padded payloads are refused.
    let short = GraphMessage::decode(&req[9..req.len() - 1], 16, 16);
    assert_eq!(
        short,
        Err(WireError::BadSize {
            what: "graph",
            expected: 908,
            got: 907
        })
    );
    let mut long = req[9..].to_vec();
    long.push(0);
    let long = GraphMessage::decode(&long, 16, 16);
    assert_eq!(
        long,
        Err(WireError::BadSize {
            what: "graph",
            expected: 908,
            got: 909
        })
    );
    let r = GraphMessage::decode(&req[9..], 0, 16);
    assert_eq!(
        r,
        Err(WireError::OverLimit {
            what: "graph nodes",
            got: 1,
            limit: 0
        })
    );
}

const GET_OUT_320: &str = "
0000: 08 38 01 00 00 00 00 00 00 03 00 00 00 00 00 00
0010: 00 00 00 00 00 60 07 fd 86 66 55 00 00 04 00 00
0020: 00 01 00 00 00 01 00 00 00 01 00 00 00 04 00 00
0030: 00 10 00 00 00 10 00 00 00 10 00 00 00 02 00 00
0040: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0050: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0060: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0070: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0080: 00 12 00 00 00 01 00 00 00 00 00 00 00 02 00 00
0090: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00a0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00b0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00c0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00d0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
00e0: 00 00 00 00 00 40 ab fc 86 66 55 00 00 6f 75 74
00f0: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0100: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0110: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0120: 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00
0130: 00 00 00 00 00 00 00 00 00 10 00 00 00 00 00 00";

#[test]
fn get_tensor_request() {
    let get = GetTensorRequest {
        tensor: vec_a_tensor(3),
        offset: 0,
        size: 16,
    };
    let req = typed(&get);
    assert_eq!(req.len(), 321);
    assert_eq!(req[..320], hex(GET_OUT_320)[..]);
    assert_eq!(req[320], 0);
    assert_eq!(Command::GetTensor.fixed_request_size(), Some(312));
    assert_eq!(GetTensorRequest::decode(&req[9..]).unwrap(), get);
    // The answer: out = a + b = 11, 22, 33, 44.
    let resp = hex("0000: 10 00 00 00 00 00 00 00 00 00 30 41 00 00 b0 41
                    0010: 00 00 04 42 00 00 30 42");
    let got = TensorData(f32s(&[11.0, 22.0, 33.0, 44.0]));
    assert_eq!(TensorData::decode(answer(&resp)).unwrap(), got);
    assert_eq!(got.to_bytes(), answer(&resp));
}

#[test]
fn command_sizes_match_the_table() {
    use Command::*;
    let expect: &[(Command, Option<usize>, Option<usize>)] = &[
        (AllocBuffer, Some(12), Some(16)),
        (GetAlignment, Some(4), Some(8)),
        (GetMaxSize, Some(4), Some(8)),
        (BufferGetBase, Some(8), Some(8)),
        (FreeBuffer, Some(8), None),
        (BufferClear, Some(9), None),
        (SetTensor, None, None),
        (SetTensorHash, Some(312), Some(1)),
        (GetTensor, Some(312), None),
        (CopyTensor, Some(592), Some(1)),
        (GraphCompute, None, None),
        (GetDeviceMemory, Some(4), Some(16)),
        (InitTensor, Some(296), None),
        (GetAllocSize, Some(3260), Some(8)),
        (Hello, Some(24), Some(28)),
        (DeviceCount, Some(0), Some(4)),
        (GraphRecompute, Some(4), None),
        (MemsetTensor, Some(313), None),
    ];
    for (i, &(c, req, resp)) in expect.iter().enumerate() {
        assert_eq!(c as u8, i as u8);
        assert_eq!(Command::from_u8(i as u8), Some(c));
        assert_eq!(c.fixed_request_size(), req, "{c}");
        assert_eq!(c.fixed_response_size(), resp, "{c}");
    }
    assert_eq!(Command::from_u8(18), None);
    assert_eq!(Command::from_u8(19), None);
    assert_eq!(Command::from_u8(255), None);
}

/// §4.1 of the spec: GGML_OP names 0..=100 of ggml 0.25.3.
const OP_NAMES: &str = "NONE DUP ADD ADD_ID ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS CUMSUM MEAN \
ARGMAX COUNT_EQUAL REPEAT REPEAT_BACK CONCAT SILU_BACK NORM RMS_NORM RMS_NORM_BACK GROUP_NORM L2_NORM MUL_MAT \
MUL_MAT_ID OUT_PROD SCALE SET CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS GET_ROWS_BACK SET_ROWS DIAG \
DIAG_MASK_INF DIAG_MASK_ZERO SOFT_MAX SOFT_MAX_BACK ROPE ROPE_BACK CLAMP CONV_TRANSPOSE_1D IM2COL IM2COL_BACK \
IM2COL_3D COL2IM_1D CONV_2D CONV_3D CONV_2D_DW CONV_TRANSPOSE_2D POOL_1D POOL_2D POOL_2D_BACK UPSCALE PAD \
PAD_REFLECT_1D ROLL ARANGE TIMESTEP_EMBEDDING ARGSORT TOP_K LEAKY_RELU TRI FILL FLASH_ATTN_EXT FLASH_ATTN_BACK \
SSM_CONV SSM_SCAN WIN_PART WIN_UNPART GET_REL_POS ADD_REL_POS RWKV_WKV6 GATED_LINEAR_ATTN RWKV_WKV7 SOLVE_TRI \
GATED_DELTA_NET LIGHTNING_INDEXER DSV4_HC_COMB DSV4_HC_PRE DSV4_HC_POST UNARY MAP_CUSTOM1 MAP_CUSTOM2 MAP_CUSTOM3 \
CUSTOM CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK OPT_STEP_ADAMW OPT_STEP_SGD GLU";

/// §4.3: GGML_UNARY_OP names 0..=21.
const UNARY_NAMES: &str = "ABS SGN NEG STEP TANH ELU RELU SIGMOID GELU GELU_QUICK SILU HARDSWISH HARDSIGMOID EXP \
EXPM1 SOFTPLUS GELU_ERF XIELU FLOOR CEIL ROUND TRUNC";

/// §4.2: type names 0..=42 ("-" for removed ids) with block size and bytes per block.
const TYPES: &[(&str, usize, usize)] = &[
    ("f32", 1, 4),
    ("f16", 1, 2),
    ("q4_0", 32, 18),
    ("q4_1", 32, 20),
    ("-", 0, 0),
    ("-", 0, 0),
    ("q5_0", 32, 22),
    ("q5_1", 32, 24),
    ("q8_0", 32, 34),
    ("q8_1", 32, 36),
    ("q2_K", 256, 84),
    ("q3_K", 256, 110),
    ("q4_K", 256, 144),
    ("q5_K", 256, 176),
    ("q6_K", 256, 210),
    ("q8_K", 256, 292),
    ("iq2_xxs", 256, 66),
    ("iq2_xs", 256, 74),
    ("iq3_xxs", 256, 98),
    ("iq1_s", 256, 50),
    ("iq4_nl", 32, 18),
    ("iq3_s", 256, 110),
    ("iq2_s", 256, 82),
    ("iq4_xs", 256, 136),
    ("i8", 1, 1),
    ("i16", 1, 2),
    ("i32", 1, 4),
    ("i64", 1, 8),
    ("f64", 1, 8),
    ("iq1_m", 256, 56),
    ("bf16", 1, 2),
    ("-", 0, 0),
    ("-", 0, 0),
    ("-", 0, 0),
    ("tq1_0", 256, 54),
    ("tq2_0", 256, 66),
    ("-", 0, 0),
    ("-", 0, 0),
    ("-", 0, 0),
    ("mxfp4", 32, 17),
    ("nvfp4", 64, 36),
    ("q1_0", 128, 18),
    ("q2_0", 64, 18),
];

#[test]
fn op_table_matches_protocol_7() {
    let names: Vec<&str> = OP_NAMES.split_whitespace().collect();
    assert_eq!(names.len(), 101);
    let unary: Vec<&str> = UNARY_NAMES.split_whitespace().collect();
    assert_eq!(unary.len(), 22);
    for op in Op::ALL {
        let (id, sub) = op_to_wire(op).expect("every op of ours is mappable today");
        assert_eq!(names[id as usize], op.name(), "{op:?}");
        assert_eq!(op_from_wire(id, sub.unwrap_or(0)), Some(op));
    }
    for u in UnaryOp::ALL {
        let id = unary_to_wire(u).unwrap();
        assert_eq!(unary[id as usize], u.name(), "{u:?}");
        assert_eq!(op_to_wire(Op::Unary(u)), Some((91, Some(id))));
        assert_eq!(op_from_wire(91, id), Some(Op::Unary(u)));
    }
    // Every wire id that is not ours maps to nothing.
    let mapped: Vec<u32> = Op::ALL.iter().map(|&o| op_to_wire(o).unwrap().0).collect();
    for id in 0..200u32 {
        if !mapped.contains(&id) {
            assert_eq!(op_from_wire(id, 0), None, "{id}");
        }
    }
    for sub in -1..40 {
        let ours = UnaryOp::ALL.iter().any(|&u| unary_to_wire(u) == Some(sub));
        assert_eq!(op_from_wire(91, sub).is_some(), ours, "{sub}");
    }
}

#[test]
fn type_table_matches_protocol_7() {
    assert_eq!(TYPES.len(), 43);
    for (id, &(name, blck, size)) in TYPES.iter().enumerate() {
        match type_from_wire(id as u32) {
            Some(ty) => {
                assert_eq!(ty.name(), name);
                assert_eq!(ty.block_size(), blck);
                assert_eq!(ty.type_size(), size);
                assert_eq!(backend_rpc::mapping::type_to_wire(ty), id as u32);
            }
            None => assert!(
                name == "-"
                    || name.starts_with("iq")
                    || ["tq1_0", "tq2_0", "mxfp4", "nvfp4", "q1_0", "q2_0"].contains(&name),
                "{name} should be mappable"
            ),
        }
    }
    for ty in ElementType::ALL {
        assert_eq!(TYPES[ty.id() as usize].0, ty.name());
    }
    assert_eq!(type_from_wire(43), None);
}
