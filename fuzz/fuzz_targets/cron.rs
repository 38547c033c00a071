//! AFL++ entry point of the `cron` target; the check itself is
//! [`leasehold_fuzz::cron::check`], which `cargo test` also replays.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        leasehold_fuzz::cron::check(data);
    });
}
