//! The Faults service's bad requests, on a node started with fault
//! injection. Each SetClock case asks for a day's skew besides its bad
//! rate, so one that were taken would show in cluster time.

use leasehold_proto::v1;
use tonic::Code;

use super::Case;
use super::wire::rpc;

const DAY_MS: i64 = 24 * 60 * 60 * 1_000;

/// The Faults cases.
pub fn cases() -> Vec<Case> {
    let clock = |rate: f64| rpc::set_clock(v1::SetClockRequest { offset_ms: DAY_MS, rate });
    let bad =
        |name: &str, rate: f64| Case::malformed(name, clock(rate), Code::InvalidArgument, "rate");
    let mut cases = vec![
        bad("set clock: rate NaN", f64::NAN),
        bad("set clock: rate -1", -1.0),
        bad("set clock: rate +infinity", f64::INFINITY),
        bad("set clock: rate -infinity", f64::NEG_INFINITY),
    ];
    // Every RPC: a message over the 64 KiB limit (each would otherwise be
    // served: a day's skew, a failing probe, a failing store), and bytes
    // that are no message.
    let harmless = [
        clock(1.0),
        rpc::set_probe_fault(v1::SetFaultRequest { on: true }),
        rpc::set_store_fault(v1::SetFaultRequest { on: true }),
    ];
    for call in harmless {
        cases.push(Case::garbage(call.path));
        cases.push(Case::over_limit(call));
    }
    cases
}
