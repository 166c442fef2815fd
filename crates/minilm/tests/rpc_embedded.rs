//! Remote offload: the last layers on our RPC server started in-process (`--rpc embedded`)
//! give the embeddings of the all-CPU run — within the candle test's tolerance (cosine ≥
//! 0.99999, max abs diff ≤ 1e-4) and in fact bit for bit, since the server computes with the
//! same CPU kernels on the same bytes and the thread counts are equal.

mod common;

use minilm::{EMBEDDED, Embedder, EmbedderOptions};

fn embed(rpc: Vec<String>, offload: usize) -> (Vec<Vec<f32>>, usize) {
    let dir = common::model_dir().expect("checked by the caller");
    let mut e = Embedder::new(EmbedderOptions {
        model_dir: Some(dir),
        threads: 2,
        offload,
        rpc,
        ..Default::default()
    })
    .unwrap();
    let v = e.embed(&common::SENTENCES).unwrap();
    (v, e.n_splits())
}

fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], what: &str) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), 384);
        let cos = minilm::cosine(g, w);
        let diff = g
            .iter()
            .zip(w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(cos >= 0.99999, "{what}, sentence {i}: cosine {cos}");
        assert!(diff <= 1e-4, "{what}, sentence {i}: max abs diff {diff}");
        // Same kernels, same inputs, same thread count: the same bits.
        let gb: Vec<u32> = g.iter().map(|x| x.to_bits()).collect();
        let wb: Vec<u32> = w.iter().map(|x| x.to_bits()).collect();
        assert_eq!(gb, wb, "{what}, sentence {i}: not bit-identical");
    }
}

#[test]
#[cfg_attr(miri, ignore = "maps files, opens sockets, BLAS-sized work")]
fn embedded_server_gives_the_local_embeddings() {
    if common::model_dir().is_none() {
        return;
    }
    let (local, local_splits) = embed(Vec::new(), 0);
    assert_eq!(local_splits, 1);

    // Default share with --rpc: half the layers (3 of 6) on the remote device.
    let (remote, splits) = embed(vec![EMBEDDED.to_owned()], 0);
    assert!(splits > 1, "the graph should split, got {splits} split(s)");
    assert_close(&remote, &local, "embedded, default offload");

    // Two remote devices sharing 5 layers (3 + 2), the first layer stays local.
    let (two, splits) = embed(vec![EMBEDDED.to_owned(), EMBEDDED.to_owned()], 5);
    assert!(
        splits >= 3,
        "two remote devices and the CPU: {splits} split(s)"
    );
    assert_close(&two, &local, "two embedded servers, offload 5");
}

#[test]
#[cfg_attr(miri, ignore = "opens sockets")]
fn unreachable_endpoint_is_a_typed_error() {
    let Some(dir) = common::model_dir() else {
        return;
    };
    // A port nobody listens on: bind, note the port, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = Embedder::new(EmbedderOptions {
        model_dir: Some(dir),
        threads: 1,
        rpc: vec![format!("127.0.0.1:{port}")],
        ..Default::default()
    })
    .unwrap_err();
    assert!(
        matches!(err, minilm::MinilmError::Backend(ref m) if m.contains(&port.to_string())),
        "{err}"
    );
}
