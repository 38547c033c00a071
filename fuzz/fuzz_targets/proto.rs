//! AFL++ entry point of the `proto` target; the check itself is
//! [`leasehold_fuzz::proto::check`], which `cargo test` also replays.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        leasehold_fuzz::proto::check(data);
    });
}
