//! `leasehold dev-certs DIR`: a throwaway CA, node and client
//! certificates, and a token per role, for trying a secure cluster on one
//! machine. Never for a real fleet: the CA key sits beside the
//! certificates.

use std::path::PathBuf;
use std::process::ExitCode;

use leasehold_security::devcerts::DevCerts;

use crate::render::say;

/// Flags of `leasehold dev-certs`.
#[derive(clap::Args, Debug)]
pub struct DevCertsArgs {
    /// Where to write (created if missing). A directory that already holds
    /// a CA keeps it and its tokens, so a larger --nodes adds certificates
    /// a running cluster trusts.
    dir: PathBuf,
    /// How many node certificates (node-1 … node-N).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Another host name or address the node certificates carry (besides
    /// 127.0.0.1 and localhost); repeatable.
    #[arg(long = "host")]
    hosts: Vec<String>,
}

/// Writes the files and lists them.
pub fn run(args: DevCertsArgs) -> anyhow::Result<ExitCode> {
    let written =
        DevCerts { dir: args.dir.clone(), nodes: args.nodes, hosts: args.hosts }.write()?;
    if written.kept_ca {
        say!("kept the CA and tokens already in {}", args.dir.display());
    }
    for file in &written.files {
        say!("wrote {}", file.display());
    }
    let dir = args.dir.display();
    say!(
        "\nstart a node:  leasehold serve --tls-ca {dir}/ca.pem --tls-cert {dir}/node-1.pem \
         --tls-key {dir}/node-1.key --tokens {dir}/tokens.toml\n\
         use it:        LEASEHOLD_TLS_CA={dir}/ca.pem LEASEHOLD_TLS_CERT={dir}/client.pem \
         LEASEHOLD_TLS_KEY={dir}/client.key LEASEHOLD_TOKEN=$(cat {dir}/token-admin) \
         leasehold cluster status"
    );
    Ok(ExitCode::SUCCESS)
}
