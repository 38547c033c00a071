//! TLS material: the cluster's CA, this process's certificate and key, read
//! from PEM files, and the rustls server configuration built from them.
//!
//! Every listener asks for a client certificate and accepts only one
//! signed by the cluster's CA (mutual TLS): a plaintext client, a client
//! without a certificate and a client whose certificate another CA signed
//! never get past the handshake. The configuration is rebuilt from the
//! files on request (SIGHUP), so certificates rotate without a restart;
//! connections already open keep the certificates they started with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::identity::{Identity, IdentityError};

/// The three files a TLS-enabled process reads (`--tls-ca`, `--tls-cert`,
/// `--tls-key`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The cluster's CA certificate(s), PEM: the only issuer trusted.
    pub ca: PathBuf,
    /// This process's certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// This process's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// Why TLS material could not be used. Each names the file and the flag.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("{flag} {path}: {source}")]
    Read {
        /// The flag that names the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A file any user may write.
    #[error("{flag} {path}: {source}")]
    Mode {
        /// The flag that names the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// Its mode.
        source: crate::file_mode::WritableByAnyone,
    },
    /// A file holds no usable PEM item of the kind expected.
    #[error("{flag} {path}: {problem}")]
    Pem {
        /// The flag that names the file.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The certificate is not one leasehold can read.
    #[error("--tls-cert {path}: {source}")]
    Identity {
        /// The file.
        path: PathBuf,
        /// Why.
        source: IdentityError,
    },
    /// rustls refused the combination (for example a key that does not
    /// belong to the certificate).
    #[error("tls: {0}")]
    Config(String),
}

/// Loaded TLS material, ready to build server and client configurations.
#[derive(Clone)]
pub struct TlsMaterial {
    ca_pem: Vec<u8>,
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    roots: Arc<RootCertStore>,
    chain: Vec<CertificateDer<'static>>,
    key: Arc<PrivateKeyDer<'static>>,
    identity: Identity,
}

impl std::fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("identity", &self.identity)
            .field("roots", &self.roots.len())
            .field("chain", &self.chain.len())
            .finish_non_exhaustive()
    }
}

/// Reads one of the files, refusing one that any user may write (a key's
/// contents are secret as well, which the node reports; see
/// [`crate::file_mode`]).
fn read(flag: &'static str, path: &Path, secret: bool) -> Result<Vec<u8>, TlsError> {
    let failed = |source| TlsError::Read { flag, path: path.to_path_buf(), source };
    if let Err(source) = crate::file_mode::check(path, secret).map_err(failed)? {
        return Err(TlsError::Mode { flag, path: path.to_path_buf(), source });
    }
    std::fs::read(path).map_err(failed)
}

fn pem_error(flag: &'static str, path: &Path, problem: impl Into<String>) -> TlsError {
    TlsError::Pem { flag, path: path.to_path_buf(), problem: problem.into() }
}

fn certificates(
    flag: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(flag, path, format!("not PEM certificates: {e}")))?;
    if certificates.is_empty() {
        return Err(pem_error(flag, path, "holds no PEM certificate"));
    }
    Ok(certificates)
}

impl TlsFiles {
    /// Reads and checks the three files: the CA parses, the certificate
    /// chain parses and its leaf states an identity, and the key parses.
    pub fn load(&self) -> Result<TlsMaterial, TlsError> {
        let ca_pem = read("--tls-ca", &self.ca, false)?;
        let cert_pem = read("--tls-cert", &self.cert, false)?;
        let key_pem = read("--tls-key", &self.key, true)?;
        let mut roots = RootCertStore::empty();
        for certificate in certificates("--tls-ca", &self.ca, &ca_pem)? {
            roots.add(certificate).map_err(|e| {
                pem_error("--tls-ca", &self.ca, format!("not a usable CA certificate: {e}"))
            })?;
        }
        let chain = certificates("--tls-cert", &self.cert, &cert_pem)?;
        let identity = Identity::from_der(chain[0].as_ref())
            .map_err(|source| TlsError::Identity { path: self.cert.clone(), source })?;
        let key = PrivateKeyDer::from_pem_slice(&key_pem)
            .map_err(|e| pem_error("--tls-key", &self.key, format!("no PEM private key: {e}")))?;
        let material = TlsMaterial {
            ca_pem,
            cert_pem,
            key_pem,
            roots: Arc::new(roots),
            chain,
            key: Arc::new(key),
            identity,
        };
        // Build once, so a key that does not match its certificate fails
        // here, at start or at reload, and not at the first handshake.
        material.server_config()?;
        Ok(material)
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsMaterial {
    /// The identity this process's own certificate states.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The CA certificate(s), PEM (for a client's trust roots).
    pub fn ca_pem(&self) -> &[u8] {
        &self.ca_pem
    }

    /// The certificate chain, PEM (for a client identity).
    pub fn cert_pem(&self) -> &[u8] {
        &self.cert_pem
    }

    /// The private key, PEM (for a client identity).
    pub fn key_pem(&self) -> &[u8] {
        &self.key_pem
    }

    /// A server configuration that requires a client certificate signed by
    /// the CA and speaks HTTP/2 only (gRPC).
    pub fn server_config(&self) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let verifier = WebPkiClientVerifier::builder_with_provider(self.roots.clone(), provider())
            .build()
            .map_err(|e| TlsError::Config(format!("client verifier: {e}")))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Config(e.to_string()))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(self.chain.clone(), self.key.clone_key())
            .map_err(|e| TlsError::Config(format!("certificate and key: {e}")))?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

/// A verifier for a node dialling a peer: the peer's certificate must be
/// valid for the address under the cluster's CA (as any TLS client checks)
/// *and* name a node, so a client certificate from the same CA cannot pose
/// as a peer.
#[derive(Debug)]
pub struct NodeServerVerifier {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl NodeServerVerifier {
    /// A verifier trusting `material`'s CA.
    pub fn new(material: &TlsMaterial) -> Result<Arc<NodeServerVerifier>, TlsError> {
        let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
            material.roots.clone(),
            provider(),
        )
        .build()
        .map_err(|e| TlsError::Config(format!("server verifier: {e}")))?;
        Ok(Arc::new(NodeServerVerifier { inner }))
    }
}

impl rustls::client::danger::ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls_pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match Identity::from_der(end_entity.as_ref()) {
            Ok(Identity::Node(_)) => Ok(verified),
            Ok(Identity::Client(name)) => Err(rustls::Error::General(format!(
                "the peer's certificate is client {name:?}'s, not a node's"
            ))),
            Err(error) => Err(rustls::Error::General(error.to_string())),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A server configuration that can be swapped while the listener runs:
/// each new connection takes the one current at its handshake.
#[derive(Clone)]
pub struct SharedServerConfig {
    current: Arc<RwLock<Arc<rustls::ServerConfig>>>,
}

impl SharedServerConfig {
    /// Starts with `config`.
    pub fn new(config: Arc<rustls::ServerConfig>) -> SharedServerConfig {
        SharedServerConfig { current: Arc::new(RwLock::new(config)) }
    }

    /// The configuration for the next handshake.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the configuration for every later handshake.
    pub fn replace(&self, config: Arc<rustls::ServerConfig>) {
        match self.current.write() {
            Ok(mut guard) => *guard = config,
            Err(poisoned) => *poisoned.into_inner() = config,
        }
    }
}
