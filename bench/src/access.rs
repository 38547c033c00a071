//! How the driver reaches a leasehold node: plaintext (the default), or
//! mutual TLS with a client certificate signed by the cluster's CA plus a
//! bearer token, as any secured client would (docs/security.md). Every
//! connection the driver opens to a node — the load clients, the readiness
//! probes and the raw status stubs — goes through one [`Access`], so a TLS
//! run pays for TLS and token checks on every call it measures.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use leasehold_client::{Client, ClientTls};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Largest token file the driver reads; a token is a line of hex.
const MAX_TOKEN_FILE_BYTES: u64 = 4096;

/// Flags that select TLS and a token (`run`, `wait`, `wait-cluster`).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct AccessArgs {
    /// The cluster's CA certificate (PEM); with --tls-cert and --tls-key,
    /// every call uses mutual TLS.
    #[arg(long, requires_all = ["tls_cert", "tls_key"])]
    tls_ca: Option<PathBuf>,
    /// The client's certificate (PEM), signed by the CA.
    #[arg(long, requires_all = ["tls_ca", "tls_key"])]
    tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires_all = ["tls_ca", "tls_cert"])]
    tls_key: Option<PathBuf>,
    /// A file holding the token every call carries as
    /// `authorization: Bearer TOKEN` (a file, so it stays out of `ps`).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// The TLS material and token the driver presents, if any.
/// Not `Debug`: it holds the token.
#[derive(Clone, Default)]
pub struct Access {
    tls: Option<ClientTls>,
    token: Option<String>,
    /// `Bearer TOKEN`, checked once here so a raw request cannot fail later.
    authorization: Option<AsciiMetadataValue>,
}

impl Access {
    /// No TLS, no token: what a plaintext cluster on loopback accepts.
    pub fn plaintext() -> Access {
        Access::default()
    }

    /// Reads the files the flags name.
    pub fn from_args(args: &AccessArgs) -> anyhow::Result<Access> {
        let tls = match (&args.tls_ca, &args.tls_cert, &args.tls_key) {
            (Some(ca), Some(cert), Some(key)) => Some(ClientTls::from_files(ca, cert, key)?),
            (None, None, None) => None,
            _ => anyhow::bail!("--tls-ca, --tls-cert and --tls-key go together"),
        };
        let token = args.token_file.as_deref().map(read_token).transpose()?;
        let authorization = match &token {
            Some(token) => Some(
                AsciiMetadataValue::try_from(format!("Bearer {token}"))
                    .context("the token holds characters a header cannot carry")?,
            ),
            None => None,
        };
        Ok(Access { tls, token, authorization })
    }

    /// Whether calls use TLS.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A `leasehold-client` for `addrs` (one or several, comma-separated),
    /// with this TLS and token.
    pub fn client(&self, addrs: &str) -> anyhow::Result<Client> {
        let mut builder = Client::builder(addrs);
        if let Some(tls) = &self.tls {
            builder = builder.tls(tls.clone());
        }
        if let Some(token) = &self.token {
            builder = builder.token(token.clone());
        }
        Ok(builder.build()?)
    }

    /// A lazily connected channel to one node for a raw generated stub,
    /// Nagle off (as the client sets it); calls on it need [`Access::request`].
    pub fn channel(&self, addr: &str) -> anyhow::Result<Channel> {
        let scheme = if self.is_tls() { "https" } else { "http" };
        let uri =
            if addr.contains("://") { addr.to_string() } else { format!("{scheme}://{addr}") };
        let mut endpoint = Endpoint::from_shared(uri)
            .with_context(|| format!("address {addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(&tls.ca_pem))
                .identity(Identity::from_pem(&tls.cert_pem, &tls.key_pem));
            endpoint = endpoint.tls_config(config).context("tls")?;
        }
        Ok(endpoint.connect_lazy())
    }

    /// A request for a raw stub, carrying the token when there is one.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        request
    }
}

/// The token in `path`: its first line, trimmed; an error when it is
/// empty, too large or unreadable.
fn read_token(path: &Path) -> anyhow::Result<String> {
    let size =
        std::fs::metadata(path).with_context(|| format!("--token-file {}", path.display()))?.len();
    anyhow::ensure!(
        size <= MAX_TOKEN_FILE_BYTES,
        "--token-file {}: {size} bytes, more than a token ({MAX_TOKEN_FILE_BYTES} at most)",
        path.display()
    );
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--token-file {}", path.display()))?;
    let token = text.lines().next().unwrap_or_default().trim().to_string();
    anyhow::ensure!(!token.is_empty(), "--token-file {}: empty", path.display());
    Ok(token)
}
