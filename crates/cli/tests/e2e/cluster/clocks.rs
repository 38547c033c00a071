//! Clock stories (issue acceptance, clocks): what the enforced clock bound
//! and the time-keeping rules promise, judged from outside the nodes — a
//! node whose clock is two minutes off neither leads nor moves cluster
//! time and comes back once right (`skewed_node`), a worker whose claim
//! answer arrives late gives its job up before the server may hand it on
//! (`worker_deadline`), and a claim retried after its answer was lost is
//! answered with the first try's lease (`retried_claim`). The slow and
//! lossy links between a client and a node come from a proxy (`proxy`).
//!
//! Each story takes a cluster slot: the two timing stories measure
//! hundreds of milliseconds, which a machine busy with another story's
//! three nodes would blur.

mod proxy;
mod retried_claim;
mod skewed_node;
mod worker_deadline;
