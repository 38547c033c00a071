//! AFL++ entry point of the `apply` target; the check itself is
//! [`leasehold_fuzz::apply::check`], which `cargo test` also replays.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        leasehold_fuzz::apply::check(data);
    });
}
