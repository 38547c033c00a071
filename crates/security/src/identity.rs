//! Who a TLS peer is, read from its certificate.
//!
//! A node's certificate carries the URI subject alternative name
//! `leasehold://node/ID`; nothing else makes a certificate a node's. Every
//! other certificate the cluster's CA signed is a client's (the ones
//! `leasehold dev-certs` writes carry `leasehold://client/NAME`, which is
//! informational). Only node identities reach the internal services (Raft,
//! Peer, Join), and a node identity's id must match the id it claims in
//! what it sends.

use x509_parser::extensions::GeneralName;

/// The URI prefix that marks a node certificate; the node id follows.
pub const NODE_URI_PREFIX: &str = "leasehold://node/";
/// The URI prefix of a client certificate's name (informational).
pub const CLIENT_URI_PREFIX: &str = "leasehold://client/";

/// A verified TLS peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    /// A cluster node, with the id its certificate names.
    Node(u64),
    /// Any other certificate from the cluster's CA: a client. The name is
    /// the certificate's `leasehold://client/NAME`, or else its subject's
    /// common name, for logs.
    Client(String),
}

/// Why a certificate could not be read as an identity.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum IdentityError {
    /// Not a parsable X.509 certificate.
    #[error("certificate: not a valid X.509 certificate")]
    Malformed,
    /// It names more than one node, or a node id that is not a number >= 1.
    #[error("certificate: {0}")]
    BadNodeName(String),
}

impl Identity {
    /// The identity a DER certificate states. A certificate is a node's
    /// when it has exactly one `leasehold://node/ID` URI name.
    pub fn from_der(der: &[u8]) -> Result<Identity, IdentityError> {
        let (_, certificate) =
            x509_parser::parse_x509_certificate(der).map_err(|_| IdentityError::Malformed)?;
        let mut nodes = Vec::new();
        let mut client = None;
        if let Ok(Some(names)) = certificate.subject_alternative_name() {
            for name in &names.value.general_names {
                if let GeneralName::URI(uri) = name {
                    if let Some(id) = uri.strip_prefix(NODE_URI_PREFIX) {
                        nodes.push(id.to_string());
                    } else if let Some(name) = uri.strip_prefix(CLIENT_URI_PREFIX) {
                        client = Some(name.to_string());
                    }
                }
            }
        } else if certificate.subject_alternative_name().is_err() {
            return Err(IdentityError::Malformed);
        }
        match nodes.as_slice() {
            [] => {}
            [id] => {
                return match id.parse::<u64>() {
                    Ok(id) if id >= 1 => Ok(Identity::Node(id)),
                    _ => Err(IdentityError::BadNodeName(format!(
                        "{NODE_URI_PREFIX}{id}: the node id must be a number >= 1"
                    ))),
                };
            }
            _ => {
                return Err(IdentityError::BadNodeName(format!(
                    "names {} nodes; a node certificate names exactly one",
                    nodes.len()
                )));
            }
        }
        let name = client.unwrap_or_else(|| {
            certificate
                .subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .unwrap_or("unnamed")
                .to_string()
        });
        Ok(Identity::Client(name))
    }

    /// The node id, when this is a node.
    pub fn node_id(&self) -> Option<u64> {
        match self {
            Identity::Node(id) => Some(*id),
            Identity::Client(_) => None,
        }
    }
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Identity::Node(id) => write!(f, "node {id}"),
            Identity::Client(name) => write!(f, "client {name:?}"),
        }
    }
}
