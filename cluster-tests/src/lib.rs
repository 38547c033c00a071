//! The leasehold chaos harness: real `leasehold serve` processes behind
//! harness-owned TCP proxies, faults injected into processes, links, clocks
//! and disks, a Jepsen-style history of every client operation, and one
//! checker per guarantee of SPEC §7.
//!
//! ```text
//!  plan (seed) ──► runner ──► supervisor ── N × `leasehold serve` (127.0.0.(base+N))
//!                    │            ▲                 ▲ peers and clients connect
//!                    │            │ signals          │ through the proxies, over
//!                    │            │                  │ mutual TLS with role tokens
//!                    ├──► nemesis ┼──► proxies ──────┘ (per source, per direction)
//!                    │            └──► Faults RPC (clock, store)
//!                    ├──► producers / workers / zombies ──► fenced sink
//!                    │         │ every operation
//!                    │         ▼
//!                    │      history.jsonl
//!                    └──► checkers ──► summary ("N passed, N failed")
//! ```
//!
//! Every run speaks mutual TLS with a token per client role unless it is
//! started with `--plaintext` (`security.rs`), so every fault is also a
//! fault of TLS connections.
//!
//! This crate is test tooling end to end, so it uses `anyhow` throughout
//! rather than typed errors: every error ends a run with a message.
//! `docs/reliability.md` says how to run it and what each checker proves.

pub mod checkers;
pub mod cron;
pub mod disk;
pub mod execlog;
pub mod faults;
pub mod history;
pub mod plan;
pub mod proxy;
pub mod runner;
pub mod security;
pub mod sink;
pub mod summary;
pub mod supervisor;
pub mod workload;
