//! Every request and response struct of `backend_rpc::wire`: encode then decode gives the
//! value back, the encoding has the size the protocol table gives, and any other bytes are a
//! typed error, never a panic. The byte-exact checks against ggml's captured traffic are in
//! `vectors.rs`.

use std::fmt::Debug;

use backend_rpc::wire::*;
use proptest::prelude::*;

/// `x` survives a round trip, its encoding has `size` bytes, and every shorter or longer
/// payload is refused with the right error.
fn roundtrip<P: Payload + PartialEq + Debug>(x: &P, size: usize) {
    let bytes = x.to_bytes();
    assert_eq!(bytes.len(), size, "{}", P::WHAT);
    assert_eq!(&P::decode(&bytes).unwrap(), x, "{}", P::WHAT);
    for n in 0..bytes.len() {
        match P::decode(&bytes[..n]) {
            Err(WireError::Truncated { need, have, .. }) => {
                assert!(need > have && have == n, "{}: {need} {have} {n}", P::WHAT)
            }
            other => panic!("{} cut to {n} bytes: {other:?}", P::WHAT),
        }
    }
    let mut long = bytes.clone();
    long.push(0);
    assert!(
        matches!(P::decode(&long), Err(WireError::BadSize { .. })),
        "{}",
        P::WHAT
    );
}

fn fixed<P: FixedPayload + PartialEq + Debug>(x: &P) {
    roundtrip(x, P::SIZE);
}

fn tensor() -> impl Strategy<Value = RpcTensor> {
    (
        (any::<u64>(), any::<u32>(), any::<u64>(), any::<[u32; 4]>()),
        (
            any::<[u32; 4]>(),
            any::<u32>(),
            any::<[i32; 16]>(),
            any::<i32>(),
        ),
        (any::<[u64; 10]>(), any::<u64>(), any::<u64>(), any::<u64>()),
        (prop::collection::vec(any::<u8>(), 64), any::<i32>()),
    )
        .prop_map(
            |(
                (id, ty, buffer, ne),
                (nb, op, op_params, flags),
                (src, view_src, view_offs, data),
                (name, use_count),
            )| {
                let mut t = RpcTensor {
                    id,
                    ty,
                    buffer,
                    ne,
                    nb,
                    op,
                    op_params,
                    flags,
                    src,
                    view_src,
                    view_offs,
                    data,
                    use_count,
                    ..Default::default()
                };
                t.name.copy_from_slice(&name);
                t
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn scalar_messages_round_trip(d in any::<u32>(), a in any::<u64>(), b in any::<u64>(), v in any::<u8>(), f in any::<bool>(), caps in any::<[u8; 24]>(), ver in any::<[u8; 3]>()) {
        fixed(&HelloRequest { caps });
        fixed(&HelloResponse { major: ver[0], minor: ver[1], patch: ver[2], caps });
        fixed(&DeviceCountRequest {});
        fixed(&DeviceCountResponse { count: d });
        fixed(&GetAlignmentRequest { device: d });
        fixed(&GetAlignmentResponse { alignment: a });
        fixed(&GetMaxSizeRequest { device: d });
        fixed(&GetMaxSizeResponse { max_size: a });
        fixed(&GetDeviceMemoryRequest { device: d });
        fixed(&GetDeviceMemoryResponse { free: a, total: b });
        fixed(&AllocBufferRequest { device: d, size: a });
        fixed(&AllocBufferResponse { remote_ptr: a, remote_size: b });
        fixed(&BufferGetBaseRequest { remote_ptr: a });
        fixed(&BufferGetBaseResponse { base_ptr: a });
        fixed(&FreeBufferRequest { remote_ptr: a });
        fixed(&BufferClearRequest { remote_ptr: a, value: v });
        fixed(&SetTensorHashResponse { found: f });
        fixed(&CopyTensorResponse { copied: f });
        fixed(&GetAllocSizeResponse { alloc_size: a });
        fixed(&GraphRecomputeRequest { device: d });
        fixed(&NoResponse);
    }

    #[test]
    fn tensor_messages_round_trip(t in tensor(), u in tensor(), a in any::<u64>(), b in any::<u64>(), d in any::<u32>(), v in any::<u8>(), f in any::<bool>(), data in prop::collection::vec(any::<u8>(), 0..64)) {
        fixed(&SetTensorRequest { tensor: t, cache: f, offset: a });
        fixed(&SetTensorHashRequest { tensor: t, offset: a, hash: b });
        fixed(&GetTensorRequest { tensor: t, offset: a, size: b });
        fixed(&CopyTensorRequest { src: t, dst: u });
        fixed(&InitTensorRequest { tensor: t });
        let mut srcs = [RpcTensor::default(); 10];
        srcs[0] = u;
        srcs[9] = t;
        fixed(&GetAllocSizeRequest { device: d, tensor: t, srcs });
        fixed(&MemsetTensorRequest { tensor: t, offset: a, size: b, value: v });
        // Variable size: the data is everything after the fixed part.
        let req = SetTensorRequest { tensor: t, cache: f, offset: a };
        let mut payload = req.to_bytes();
        payload.extend_from_slice(&data);
        prop_assert_eq!(SetTensorRequest::split(&payload).unwrap(), (req, &data[..]));
        let short = SetTensorRequest::split(&payload[..SetTensorRequest::SIZE - 1]);
        prop_assert!(matches!(short, Err(WireError::Truncated { .. })), "{:?}", short);
        let resp = TensorData(data.clone());
        prop_assert_eq!(TensorData::decode(&resp.to_bytes()).unwrap(), resp);
    }

    /// Whatever the bytes, decoding gives a value (only from exactly the right number of bytes)
    /// or an error.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..3400)) {
        fn check<P: FixedPayload>(b: &[u8]) {
            assert_eq!(P::decode(b).is_ok(), b.len() == P::SIZE, "{}", P::WHAT);
        }
        check::<HelloRequest>(&bytes);
        check::<HelloResponse>(&bytes);
        check::<DeviceCountRequest>(&bytes);
        check::<DeviceCountResponse>(&bytes);
        check::<GetAlignmentRequest>(&bytes);
        check::<GetAlignmentResponse>(&bytes);
        check::<GetMaxSizeRequest>(&bytes);
        check::<GetMaxSizeResponse>(&bytes);
        check::<GetDeviceMemoryRequest>(&bytes);
        check::<GetDeviceMemoryResponse>(&bytes);
        check::<AllocBufferRequest>(&bytes);
        check::<AllocBufferResponse>(&bytes);
        check::<BufferGetBaseRequest>(&bytes);
        check::<BufferGetBaseResponse>(&bytes);
        check::<FreeBufferRequest>(&bytes);
        check::<BufferClearRequest>(&bytes);
        check::<SetTensorRequest>(&bytes);
        check::<SetTensorHashRequest>(&bytes);
        check::<SetTensorHashResponse>(&bytes);
        check::<GetTensorRequest>(&bytes);
        check::<CopyTensorRequest>(&bytes);
        check::<CopyTensorResponse>(&bytes);
        check::<InitTensorRequest>(&bytes);
        check::<GetAllocSizeRequest>(&bytes);
        check::<GetAllocSizeResponse>(&bytes);
        check::<GraphRecomputeRequest>(&bytes);
        check::<MemsetTensorRequest>(&bytes);
        prop_assert_eq!(SetTensorRequest::split(&bytes).is_ok(), bytes.len() >= SET_TENSOR_FIXED);
        let _ = GraphMessage::decode(&bytes, 64, 64);
    }
}

/// Each request names its command, and the structs' sizes are the command table's.
#[test]
fn requests_name_their_command_and_size() {
    fn req<R: Request + FixedPayload>(cmd: Command) {
        assert_eq!(R::COMMAND, cmd);
        assert_eq!(Some(R::SIZE), cmd.fixed_request_size(), "{cmd}");
        assert_eq!(
            cmd.has_response(),
            R::Response::WHAT != NoResponse::WHAT,
            "{cmd}"
        );
    }
    req::<HelloRequest>(Command::Hello);
    req::<DeviceCountRequest>(Command::DeviceCount);
    req::<GetAlignmentRequest>(Command::GetAlignment);
    req::<GetMaxSizeRequest>(Command::GetMaxSize);
    req::<GetDeviceMemoryRequest>(Command::GetDeviceMemory);
    req::<AllocBufferRequest>(Command::AllocBuffer);
    req::<BufferGetBaseRequest>(Command::BufferGetBase);
    req::<FreeBufferRequest>(Command::FreeBuffer);
    req::<BufferClearRequest>(Command::BufferClear);
    req::<SetTensorHashRequest>(Command::SetTensorHash);
    req::<GetTensorRequest>(Command::GetTensor);
    req::<CopyTensorRequest>(Command::CopyTensor);
    req::<InitTensorRequest>(Command::InitTensor);
    req::<GetAllocSizeRequest>(Command::GetAllocSize);
    req::<GraphRecomputeRequest>(Command::GraphRecompute);
    req::<MemsetTensorRequest>(Command::MemsetTensor);
    // SET_TENSOR's size varies with its data; the fixed part is the struct.
    assert_eq!(SetTensorRequest::COMMAND, Command::SetTensor);
    assert_eq!(Command::SetTensor.fixed_request_size(), None);
    assert_eq!(SetTensorRequest::SIZE, 305);
    assert_eq!(SET_TENSOR_FIXED, SetTensorRequest::SIZE);
    assert_eq!(GET_ALLOC_SIZE_SIZE, GetAllocSizeRequest::SIZE);
}
