//! End-to-end acceptance tests of leasehold: real `leasehold` processes on
//! real sockets and real sled files, driven by the real gRPC client, the
//! worker loop and the CLI, one node alone or three as a cluster.
//!
//! One integration-test binary (link time matters on small CI machines); the
//! stories live in `e2e/`, the harness they share in `e2e/support.rs`. Every
//! test starts its own nodes on free 127.0.0.1 ports in its own temporary
//! directory, so the tests run in parallel (the cluster stories take turns,
//! see `e2e/cluster.rs`); a failing test keeps its directory and prints
//! where its process logs are.

mod e2e {
    pub mod support;

    mod bad_input;
    mod cli_output;
    mod cli_tour;
    mod cluster;
    mod command_worker;
    mod cron;
    mod docs_api;
    mod docs_backup;
    mod docs_commands;
    mod docs_deploy;
    mod docs_events;
    mod gate;
    mod http_limits;
    mod kill_restart;
    mod lease_expiry;
    mod lifecycle;
    mod quiet_log;
    mod runtime_threads;
    mod sdk;
    mod security;
    mod session;
    mod status_page;
}
