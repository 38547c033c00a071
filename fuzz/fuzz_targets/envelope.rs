//! AFL++ entry point of the `envelope` target; the check itself is
//! [`leasehold_fuzz::envelope::check`], which `cargo test` also replays.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        leasehold_fuzz::envelope::check(data);
    });
}
