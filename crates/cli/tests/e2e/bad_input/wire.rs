//! The wire tools of the bad-input table: a codec that sends a message's
//! bytes exactly as given (so a case can be a typed request, a typed
//! request padded past a decode limit, or bytes no decoder accepts), the
//! padding itself, and one typed constructor per RPC of every service.

use prost::Message;
use prost::bytes::{Buf, BufMut};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};

/// One request to one RPC, as the bytes of its message.
#[derive(Clone)]
pub struct Call {
    /// The gRPC path, `/leasehold.v1.Service/Method`.
    pub path: &'static str,
    /// The message, as sent.
    pub bytes: Vec<u8>,
}

impl Call {
    /// `message` encoded for the RPC at `path`.
    pub fn encode(path: &'static str, message: &impl Message) -> Call {
        Call { path, bytes: message.encode_to_vec() }
    }

    /// These bytes as the message of the RPC at `path`.
    pub fn raw(path: &'static str, bytes: &[u8]) -> Call {
        Call { path, bytes: bytes.to_vec() }
    }

    /// This call with its message grown to exactly `total_bytes` by an
    /// unknown field (number [`PADDING_FIELD`]), which a decoder skips: the
    /// request means what it meant, only its size changes.
    pub fn padded_to(mut self, total_bytes: usize) -> Call {
        pad(&mut self.bytes, total_bytes);
        self
    }
}

/// The field number the padding uses; no message of leasehold.v1 has it.
pub const PADDING_FIELD: u32 = 1_000;

/// Appends one length-delimited unknown field so `bytes` is exactly
/// `total_bytes` long (or leaves it alone when it is already longer than
/// that less a field header). The length is written as a five-byte varint,
/// non-minimal for small lengths (decoders accept that), so every total
/// fits exactly.
fn pad(bytes: &mut Vec<u8>, total_bytes: usize) {
    const LENGTH_BYTES: usize = 5;
    let key = (u64::from(PADDING_FIELD) << 3) | 2;
    let Some(content) = total_bytes.checked_sub(bytes.len() + 2 + LENGTH_BYTES) else { return };
    prost::encoding::encode_varint(key, bytes);
    for shift in 0..LENGTH_BYTES {
        let group = ((content >> (7 * shift)) & 0x7f) as u8;
        bytes.push(if shift + 1 < LENGTH_BYTES { group | 0x80 } else { group });
    }
    bytes.resize(bytes.len() + content, b'p');
}

/// Bytes that are no protobuf message at all: a field key whose varint
/// never ends.
pub const GARBAGE: &[u8] = &[0xff, 0xff, 0xff, 0xff];

/// Sends and receives messages as raw bytes.
#[derive(Clone, Copy, Debug, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let mut bytes = vec![0; src.remaining()];
        src.copy_to_slice(&mut bytes);
        Ok(Some(bytes))
    }
}

/// One typed constructor per RPC, and the list of every RPC a node serves.
macro_rules! rpcs {
    ($($name:ident($message:ty) = $path:literal;)*) => {
        $(
            #[doc = concat!("A call of `", $path, "`.")]
            pub fn $name(message: $message) -> Call {
                Call::encode($path, &message)
            }
        )*
        /// Every RPC of every leasehold service (Faults only on a node
        /// started with fault injection).
        pub const EVERY_RPC: &[&str] = &[$($path),*];
    };
}

/// The typed calls.
pub mod rpc {
    use leasehold_proto::v1;

    use super::Call;

    rpcs! {
        enqueue(v1::EnqueueRequest) = "/leasehold.v1.Queue/Enqueue";
        claim(v1::ClaimRequest) = "/leasehold.v1.Queue/Claim";
        refresh(v1::RefreshRequest) = "/leasehold.v1.Queue/Refresh";
        ack(v1::AckRequest) = "/leasehold.v1.Queue/Ack";
        nack(v1::NackRequest) = "/leasehold.v1.Queue/Nack";
        release(v1::ReleaseRequest) = "/leasehold.v1.Queue/Release";
        get_job(v1::GetJobRequest) = "/leasehold.v1.Queue/GetJob";
        list_jobs(v1::ListJobsRequest) = "/leasehold.v1.Queue/ListJobs";
        stats(v1::StatsRequest) = "/leasehold.v1.Queue/Stats";
        redrive(v1::RedriveRequest) = "/leasehold.v1.Queue/Redrive";
        put_schedule(v1::PutScheduleRequest) = "/leasehold.v1.Schedules/Put";
        delete_schedule(v1::DeleteScheduleRequest) = "/leasehold.v1.Schedules/Delete";
        get_schedule(v1::GetScheduleRequest) = "/leasehold.v1.Schedules/Get";
        list_schedules(v1::ListSchedulesRequest) = "/leasehold.v1.Schedules/List";
        pause_schedule(v1::PauseScheduleRequest) = "/leasehold.v1.Schedules/Pause";
        resume_schedule(v1::ResumeScheduleRequest) = "/leasehold.v1.Schedules/Resume";
        trigger_schedule(v1::TriggerScheduleRequest) = "/leasehold.v1.Schedules/Trigger";
        status(v1::StatusRequest) = "/leasehold.v1.Cluster/Status";
        join(v1::JoinRequest) = "/leasehold.v1.Cluster/Join";
        remove(v1::RemoveRequest) = "/leasehold.v1.Cluster/Remove";
        drain(v1::DrainRequest) = "/leasehold.v1.Cluster/Drain";
        set_flags(v1::SetFlagsRequest) = "/leasehold.v1.Cluster/SetFlags";
        advertise(v1::Signed) = "/leasehold.v1.Peer/Advertise";
        bus(v1::Signed) = "/leasehold.v1.Peer/Bus";
        append_entries(v1::RaftEnvelope) = "/leasehold.v1.Raft/AppendEntries";
        vote(v1::RaftEnvelope) = "/leasehold.v1.Raft/Vote";
        install_snapshot(v1::RaftEnvelope) = "/leasehold.v1.Raft/InstallSnapshot";
        forward(v1::RaftEnvelope) = "/leasehold.v1.Raft/Forward";
        set_clock(v1::SetClockRequest) = "/leasehold.v1.Faults/SetClock";
        set_probe_fault(v1::SetFaultRequest) = "/leasehold.v1.Faults/SetProbeFault";
        set_store_fault(v1::SetFaultRequest) = "/leasehold.v1.Faults/SetStoreFault";
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padding_hits_the_size_exactly_and_decodes_to_the_same_message() {
        let request = leasehold_proto::v1::StatsRequest { queue: Some("q".into()), stale: true };
        for total in [16, 127, 128, 130, 16_385, 65_536, 65_537, 1 << 24] {
            let call = rpc::stats(request.clone()).padded_to(total);
            assert_eq!(call.bytes.len(), total);
            let back = leasehold_proto::v1::StatsRequest::decode(call.bytes.as_slice());
            assert_eq!(back.ok(), Some(request.clone()), "at {total} bytes");
        }
    }
}
