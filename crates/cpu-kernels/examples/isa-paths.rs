//! Prints which instruction-set paths of the CPU kernels run on this machine, as one line
//! (`cargo xtask test` shows it after the tests).

#![allow(clippy::print_stdout)] // the line is this program's output

fn main() {
    println!("{}", cpu_kernels::isa_summary());
}
