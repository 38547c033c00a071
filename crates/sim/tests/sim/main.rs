//! Integration tests of the simulation, in one binary.
//!
//! - `cluster`: a seeded turmoil cluster run replays byte for byte.
//! - `conformance`: openraft's own storage suite over the simulated stores.
//! - `crash`: what the stores reported durable survives a crash; what they
//!   did not may be lost, torn, but never half-reported.
//! - `duties`: the node's real driver and executor on the simulation; both
//!   claim paths contend for ticks and each runs once; the duties go on
//!   through a leader crash and a power cut; a bus release that also
//!   releases the journal lease is found.
//! - `forward`: a follower's journal forwards writes and read-index
//!   requests to the leader over the real `Raft.Forward` gRPC call on
//!   simulated TCP; the leader stamps.
//! - `gate`: the node's real gate measures clocks by its adverts over the
//!   Peer gRPC service on simulated TCP, and every node switches claim
//!   paths at one instant when a flag changes.
//! - `hand_over`: a leader hands leadership over by `Raft.Forward`, and a
//!   voter takes a hand-over only from the leader it follows, in its term.
//! - `journal`: the replica's real journal proposes and reads through
//!   openraft on simulated disks.
//! - `journal_hosts`: the turmoil hosts with a journal each that
//!   `seeded_journal` and `forward` run on.
//! - `node_duties`: the node's driver and executor on a simulated host,
//!   its commands recorded, not started (for `duties`).
//! - `one_way`: a link cut in one direction loses that direction only.
//! - `readiness`: a node's readiness holds through a change of leader and
//!   fails once an election has run past one election timeout.
//! - `raft`: three openraft nodes on simulated disks survive a follower crash.
//! - `seeded_journal`: the journal on turmoil, stamping with its host's
//!   simulated clock, replays from its seed.
//! - `sweep`: many short seeds, none with a safety anomaly (`scripts/sim.sh`).
//! - `unmeasured`: a leader whose clock no majority measures hands
//!   leadership over, and a voter that can stamp takes writes again.

mod cluster;
mod conformance;
mod crash;
mod duties;
mod forward;
mod gate;
mod hand_over;
mod journal;
mod journal_hosts;
mod node_duties;
mod one_way;
mod planted;
mod raft;
mod readiness;
mod seeded_journal;
mod sweep;
mod unmeasured;
