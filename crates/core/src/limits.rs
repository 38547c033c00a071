//! Limits and defaults on everything a command may carry.

use serde::{Deserialize, Serialize};

/// Bounds applied by validation. The defaults are the documented product
/// defaults; the node may lower `max_payload_bytes` by configuration. `apply`
/// always validates against [`Limits::default`] so every replica decides
/// identically whatever its configuration.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Largest payload (bytes).
    pub max_payload_bytes: usize,
    /// Most jobs in one enqueue, and most leases in one claim or refresh.
    pub max_batch: usize,
    /// Shortest lease.
    pub min_lease_ttl_ms: u64,
    /// Longest lease.
    pub max_lease_ttl_ms: u64,
    /// Lease length when neither claim nor job names one.
    pub default_lease_ttl_ms: u64,
    /// Attempts when the job does not name them.
    pub default_max_attempts: u32,
    /// Most attempts a job may ask for.
    pub max_max_attempts: u32,
    /// How long acked tombstones are kept for dedup and audit.
    pub retention_ms: u64,
    /// Longest worker id, idempotency key, tag or error text kept (bytes).
    pub max_text_bytes: usize,
    /// Most tags on a job or in a selector.
    pub max_tags: usize,
    /// Longest error text kept from a nack (longer text is truncated, not refused).
    pub max_error_bytes: usize,
    /// Largest result an ack may store on the job (larger is refused).
    pub max_result_bytes: usize,
}

impl Limits {
    /// The most bytes one lease of a claim's answer can take: the job it
    /// hands out, with the largest payload, error, tags and texts these
    /// limits let a job carry.
    pub fn grant_bytes_bound(&self) -> usize {
        let text = 8 + self.max_text_bytes;
        self.max_payload_bytes + self.max_error_bytes + self.max_tags * text + 4 * text + 256
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: if cfg!(feature = "older-build") { 16 * 1024 } else { 256 * 1024 },
            max_batch: 1_000,
            min_lease_ttl_ms: 1_000,
            max_lease_ttl_ms: 12 * 60 * 60 * 1_000,
            default_lease_ttl_ms: 30_000,
            default_max_attempts: 5,
            max_max_attempts: 1_000,
            retention_ms: 24 * 60 * 60 * 1_000,
            max_text_bytes: if cfg!(feature = "older-build") { 64 } else { 256 },
            max_tags: 32,
            max_error_bytes: 4 * 1024,
            max_result_bytes: 16 * 1024,
        }
    }
}
