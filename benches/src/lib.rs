//! Benchmarks live in `benches/`; this library only shares helpers between them.
