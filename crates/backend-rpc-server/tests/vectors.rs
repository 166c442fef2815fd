//! Our server's answers, byte for byte, against the vectors of `shared/spec/ggml-rpc.md`
//! (captured from a real ggml 0.25.3 rpc-server, protocol 7.0.0).

mod common;

use backend_rpc_server::ServerConfig;

#[test]
fn hello_response_matches_ggml() {
    // Our server answers exactly what ggml's did (36 bytes with the size prefix).
    let server = common::mem_server(ServerConfig::default());
    let mut s = server.session();
    let resp = s.handle(14, &[0; 24]).unwrap().unwrap();
    let mut framed = (resp.len() as u64).to_le_bytes().to_vec();
    framed.extend_from_slice(&resp);
    let mut expected = vec![0x1c, 0, 0, 0, 0, 0, 0, 0, 0x07];
    expected.resize(36, 0);
    assert_eq!(framed, expected);
}
