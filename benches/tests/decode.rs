//! The scheduled and the direct decode step agree bit for bit, step after step.

use benches::{DecodeBench, tiny_config};

#[test]
#[cfg_attr(miri, ignore)] // spawns the CPU worker pool and computes a model: too slow under Miri
fn scheduled_and_direct_steps_agree() {
    let mut bench = DecodeBench::new(tiny_config(), 2).unwrap();
    let first = bench.step_scheduled().unwrap();
    assert!(
        first
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .all(f32::is_finite),
        "logits must be finite"
    );
    assert!(first.iter().any(|&b| b != 0), "logits must not be all zero");
    for _ in 0..3 {
        assert_eq!(bench.step_direct().unwrap(), first);
        assert_eq!(bench.step_scheduled().unwrap(), first);
    }
}
