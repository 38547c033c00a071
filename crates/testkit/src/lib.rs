//! What leasehold's three test harnesses share — the end-to-end stories
//! (`crates/cli/tests/e2e`), the chaos harness (`cluster-tests`) and the
//! benchmark driver (`bench`): a sandbox directory whose logs are reported
//! when a test fails, a child process that is killed and reaped whatever
//! way the test ends, free ports, bounded waits on named conditions, how
//! long a node may take to serve, and which node leads by a set of status
//! answers.
//!
//! Test code only (`publish = false`); nothing shipped depends on it. It
//! prints to stderr, as test harnesses do.

pub mod cluster;
pub mod process;
pub mod sandbox;
pub mod wait;

pub use cluster::{NODE_READY_TIMEOUT, agreed_leader, highest_term_leader};
pub use process::Process;
pub use sandbox::Sandbox;
pub use wait::{Check, POLL_INTERVAL, deadline_in, wait_until};

/// The lowest port [`free_port`] hands out.
const LOWEST_PORT: u16 = 10_000;

/// A free TCP port on `ip` for a child process to bind moments later.
///
/// Ports come from below the kernel's ephemeral range, so no outgoing
/// connection of a test (a client, a node's peer link) can take one as its
/// source port in the gap, and one process walks them in turn, handing out
/// none twice until it has used them all, so two tests running side by
/// side cannot both be given a port one of them released. The walk starts at an offset drawn from the process id and
/// the clock, so concurrent harness processes start apart; each candidate
/// is bound once to check that nothing else holds it. A collision left over
/// (another program binding the port in the gap) fails that start loudly.
/// Where the ephemeral range leaves too little room below it, the kernel
/// picks (bind port 0).
pub fn free_port(ip: std::net::IpAddr) -> anyhow::Result<u16> {
    use anyhow::Context;
    use std::sync::atomic::{AtomicU32, Ordering};

    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);

    let highest = ephemeral_low().saturating_sub(1);
    if highest < LOWEST_PORT.saturating_add(1_000) {
        let listener =
            std::net::TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}:0"))?;
        return Ok(listener.local_addr().context("reading the bound address")?.port());
    }
    let span = u32::from(highest - LOWEST_PORT) + 1;
    if NEXT.load(Ordering::Relaxed) == u32::MAX {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let seed = std::process::id().wrapping_mul(2_654_435_761) ^ nanos;
        let _ = NEXT.compare_exchange(u32::MAX, seed % span, Ordering::Relaxed, Ordering::Relaxed);
    }
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = LOWEST_PORT + u16::try_from(offset).context("a port offset")?;
        if std::net::TcpListener::bind((ip, port)).is_ok() {
            return Ok(port);
        }
    }
    anyhow::bail!("no free port on {ip} between {LOWEST_PORT} and {highest}")
}

/// The lowest port of the kernel's ephemeral range (Linux's default,
/// 32768, where it cannot be read).
fn ephemeral_low() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_ports_are_never_handed_out_twice_and_stay_below_the_ephemeral_range()
    -> anyhow::Result<()> {
        let ip = std::net::IpAddr::from([127, 0, 0, 1]);
        let ports: Vec<u16> = (0..200).map(|_| free_port(ip)).collect::<anyhow::Result<_>>()?;
        let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(distinct.len(), ports.len(), "a port was handed out twice: {ports:?}");
        let low = ephemeral_low();
        if low >= LOWEST_PORT + 1_000 {
            assert!(ports.iter().all(|p| (LOWEST_PORT..low).contains(p)), "{ports:?}");
        }
        Ok(())
    }
}
