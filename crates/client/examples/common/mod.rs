//! What the examples share: where the cluster is and how to authenticate,
//! from flags or the same environment variables the `leasehold` CLI reads.

use std::path::PathBuf;

use leasehold_client::{Client, ClientTls};

/// How to reach the cluster.
#[derive(clap::Args, Debug)]
pub struct Connection {
    /// Any node's gRPC address (several, comma-separated, are tried in turn).
    #[arg(long, env = "LEASEHOLD_ADDR", default_value = "http://127.0.0.1:7070")]
    pub addr: String,
    /// The cluster's CA certificate (PEM); with --tls-cert and --tls-key,
    /// talk TLS.
    #[arg(long, env = "LEASEHOLD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// This client's certificate (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// This client's private key (PEM).
    #[arg(long, env = "LEASEHOLD_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// A bearer token with the role the example needs (producer, worker or
    /// admin); prefer the environment variable.
    #[arg(long, env = "LEASEHOLD_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl Connection {
    /// A client for these settings.
    pub fn client(&self) -> anyhow::Result<Client> {
        let mut builder = Client::builder(&self.addr);
        if let Some(tls) = ClientTls::from_optional_files(
            self.tls_ca.as_deref(),
            self.tls_cert.as_deref(),
            self.tls_key.as_deref(),
        )? {
            builder = builder.tls(tls);
        }
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        Ok(builder.build()?)
    }
}
