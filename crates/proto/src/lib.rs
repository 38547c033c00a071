//! Code generated from `proto/leasehold/v1`, and the only conversions between
//! wire messages and `leasehold-core` types.
//!
//! Domain types never derive prost; everything crossing the wire goes through
//! [`convert`]. It decides nothing: a conversion that fails names the field,
//! and validation is core's.

#[allow(missing_docs, clippy::all)]
pub mod v1 {
    //! Generated messages and services of package `leasehold.v1`.
    tonic::include_proto!("leasehold.v1");
}

pub mod convert;

/// Response metadata a follower adds to every Queue answer: the leader's
/// gRPC address (as the leader advertises it). A client that has that
/// address among its own sends its next calls there, sparing each write
/// the forwarding hop.
pub const LEADER_HINT_HEADER: &str = "leasehold-leader";

/// Encoded file descriptor set of every leasehold proto, for gRPC reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/leasehold_descriptor.bin"));
