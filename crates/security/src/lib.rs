//! leasehold's security primitives, with no network code of their own:
//!
//! - [`tls`]: the cluster's CA, a process's certificate and key, and the
//!   rustls server configuration that requires client certificates;
//! - [`identity`]: who a verified peer is, read from its certificate (a node
//!   names itself `leasehold://node/ID`);
//! - [`tokens`]: client tokens (stored as hashes) and their roles;
//! - [`secret`]: the cluster secret, the HMAC on peer messages, and the node
//!   proof that stands in for a node certificate without TLS;
//! - [`file_mode`]: who else may read or write a credentials file;
//! - [`devcerts`]: throwaway certificates and tokens for a dev cluster.
//!
//! The gRPC edge (`leasehold-server`) applies them to connections and calls;
//! this crate decides nothing about which call needs what.

pub mod devcerts;
pub mod file_mode;
pub mod identity;
pub mod secret;
pub mod tls;
pub mod tokens;

pub use identity::Identity;
pub use secret::ClusterSecret;
pub use tls::{NodeServerVerifier, SharedServerConfig, TlsError, TlsFiles, TlsMaterial};
pub use tokens::{Role, SharedTokens, TokenEntry, TokenSet};
