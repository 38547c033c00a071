//! The live cutover gate of one node: its flags (changeable at run time),
//! the peer registry, the bus, and the inputs of the pure
//! [`decide_claim_path`] gathered from them.
//!
//! Every claim asks [`Gate::decide_for_claim`] once and keeps the answer for
//! the whole claim (claim, run, release), so one job never consults both
//! paths in one evaluation. The decision for a cron tick is made *as of the
//! tick's instant*: flag changes (ours and our peers') count from their
//! `since` plus the settle time of three heartbeat intervals
//! ([`leasehold_core::claim_path::value_at`]), so every node decides one tick the
//! same way and the pool switches paths at one tick.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use leasehold_core::claim_path::{
    Advert, ClaimPath, Decision, GateFlags, GateInput, Member, decide_claim_path, value_at,
};
use leasehold_proto::v1;
use leasehold_proto::v1::peer_client::PeerClient;
use tokio::sync::{Notify, watch};

use crate::adverts::{self, PeerRegistry, Rejection, Sender};
use crate::bus::{self, Bus, BusError, BusRefusal, Outcome};
use crate::journal::{Journal, role_name};
use crate::metrics::{GateLabels, OutcomeLabels, RejectLabels};
use crate::stores::AdvertStore;
use leasehold_security::secret::ClusterSecret;

/// Settings of the gate.
#[derive(Clone, Debug)]
pub struct GateConfig {
    /// How often adverts are sent; a peer is online while its advert is
    /// younger than three of these.
    pub advert_interval: Duration,
    /// An advert older than this is too old to count at all.
    pub stale_after_ms: u64,
    /// How long a bus claimant collects answers before it judges a claim.
    pub bus_window: Duration,
    /// This node's version, as advertised.
    pub version: String,
}

impl GateConfig {
    /// The heartbeat interval in ms.
    pub fn interval_ms(&self) -> u64 {
        u64::try_from(self.advert_interval.as_millis()).unwrap_or(u64::MAX)
    }

    /// How long after a flag change the change counts: three heartbeat
    /// intervals, time for every online peer to have heard of it.
    pub fn settle_ms(&self) -> u64 {
        self.interval_ms().saturating_mul(3)
    }
}

/// This node's flags and their last change.
#[derive(Clone, Copy, Debug)]
struct FlagState {
    current: GateFlags,
    before: GateFlags,
    since_ms: u64,
}

struct Inner {
    journal: Journal,
    config: GateConfig,
    secret: ClusterSecret,
    flags: Mutex<FlagState>,
    registry: PeerRegistry,
    bus: Bus,
    started: Instant,
    flags_changed: Notify,
    last_decision: Mutex<Option<(ClaimPath, String)>>,
}

/// Cheap to clone; shared by the Cluster and Peer services and the driver.
#[derive(Clone)]
pub struct Gate {
    inner: Arc<Inner>,
}

/// The nodes a decision counts: every member, and a node outside the
/// membership (an older scheduler beside the cluster) only while its advert
/// is fresh. A removed member's advert kept on disk would otherwise hold
/// the pool on the bus after every restart until the registry was pruned,
/// naming a node long gone.
fn counted_nodes(
    members: impl Iterator<Item = u64>,
    entries: &BTreeMap<u64, adverts::Entry>,
    now: Instant,
    stale_after_ms: u64,
) -> BTreeSet<u64> {
    let heard =
        entries.iter().filter(|(_, entry)| entry.age_ms(now) < stale_after_ms).map(|(id, _)| *id);
    members.chain(heard).collect()
}

impl Gate {
    /// The gate of `journal`'s node, signing with `secret`.
    pub fn new(
        journal: Journal,
        config: GateConfig,
        flags: GateFlags,
        secret: ClusterSecret,
        bus: Bus,
        peers: Arc<dyn AdvertStore>,
    ) -> Gate {
        let node_id = journal.node_id();
        let registry =
            PeerRegistry::with_store(node_id, peers, Instant::now(), journal.clock().now_ms())
                .stale_after(config.stale_after_ms);
        Gate {
            inner: Arc::new(Inner {
                journal,
                config,
                secret,
                flags: Mutex::new(FlagState { current: flags, before: flags, since_ms: 0 }),
                registry,
                bus,
                started: Instant::now(),
                flags_changed: Notify::new(),
                last_decision: Mutex::new(None),
            }),
        }
    }

    /// This node's clock now (what an advert's answer tells the sender).
    pub fn now_ms(&self) -> u64 {
        self.inner.journal.clock().now_ms()
    }

    /// This node's id.
    pub fn node_id(&self) -> u64 {
        self.inner.journal.node_id()
    }

    /// The gate's settings.
    pub fn config(&self) -> &GateConfig {
        &self.inner.config
    }

    /// The bus table.
    pub fn bus(&self) -> &Bus {
        &self.inner.bus
    }

    /// The cluster secret.
    pub fn secret(&self) -> &ClusterSecret {
        &self.inner.secret
    }

    fn flag_state(&self) -> FlagState {
        match self.inner.flags.lock() {
            Ok(state) => *state,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// This node's flags as set now (a change counts once settled).
    pub fn flags(&self) -> GateFlags {
        self.flag_state().current
    }

    /// Changes the flags (unset ones keep their value) and answers them.
    /// The change is advertised at once and counts from now plus the
    /// settle time.
    pub fn set_flags(&self, journal_lease: Option<bool>, dry_run: Option<bool>) -> GateFlags {
        let now_ms = self.inner.journal.clock().now_ms();
        let settle_ms = self.inner.config.settle_ms();
        let updated = {
            let mut state = match self.inner.flags.lock() {
                Ok(state) => state,
                Err(poisoned) => poisoned.into_inner(),
            };
            let mut next = state.current;
            if let Some(on) = journal_lease {
                next.journal_lease = on;
            }
            if let Some(on) = dry_run {
                next.journal_lease_dry_run = on;
            }
            if next != state.current {
                // What counts right now becomes the value before the change,
                // so two quick changes never skip the settle time.
                let counting =
                    value_at(state.current, state.before, state.since_ms, settle_ms, now_ms);
                *state = FlagState { current: next, before: counting, since_ms: now_ms };
            }
            state.current
        };
        tracing::info!(
            event = "gate.flags",
            node = self.node_id(),
            journal_lease = updated.journal_lease,
            dry_run = updated.journal_lease_dry_run,
            effective_in_ms = settle_ms,
            "gate flags set"
        );
        self.inner.flags_changed.notify_one();
        updated
    }

    /// Whether the node has been up for a settle time: before that it may
    /// not have heard every online peer yet, and takes no bus claims.
    pub fn warmed_up(&self) -> bool {
        self.inner.started.elapsed().as_millis() >= u128::from(self.inner.config.settle_ms())
    }

    /// Every member (id, address) of the Raft membership.
    fn membership(&self) -> Vec<(u64, String)> {
        let metrics = self.inner.journal.raft().metrics().borrow().clone();
        metrics
            .membership_config
            .membership()
            .nodes()
            .map(|(id, node)| (*id, node.addr.clone()))
            .collect()
    }

    /// The gate's input for a claim at `at_ms` (this node's clock).
    pub fn input_at(&self, at_ms: u64) -> GateInput {
        let config = &self.inner.config;
        let settle_ms = config.settle_ms();
        let state = self.flag_state();
        let flags = value_at(state.current, state.before, state.since_ms, settle_ms, at_ms);
        let membership = self.membership();
        let mut read_failure = None;
        if membership.is_empty() {
            read_failure = Some("membership is not known yet".to_string());
        }
        let entries = self.inner.registry.snapshot().unwrap_or_else(|| {
            read_failure = Some("the peer registry cannot be read".to_string());
            Default::default()
        });
        let now = Instant::now();
        let ids = counted_nodes(
            membership.iter().map(|(id, _)| *id),
            &entries,
            now,
            config.stale_after_ms,
        );
        let members = ids
            .into_iter()
            .map(|node| Member {
                node,
                advert: entries.get(&node).map(|entry| {
                    let sent = &entry.advert;
                    let journal_lease = sent.journal_lease.map(|current| {
                        let before = sent.journal_lease_before.unwrap_or(false);
                        value_at(current, before, sent.journal_lease_since_ms, settle_ms, at_ms)
                    });
                    let advert = Advert {
                        version: sent.version.clone(),
                        journal_lease,
                        draining: sent.draining,
                    };
                    (advert, entry.age_ms(now))
                }),
            })
            .collect();
        GateInput {
            node: self.node_id(),
            flags,
            members,
            read_failure,
            heartbeat_interval_ms: config.interval_ms(),
            stale_after_ms: config.stale_after_ms,
        }
    }

    /// The decision for a claim at `at_ms`, without counting it (status).
    pub fn decide_at(&self, at_ms: u64) -> Decision {
        decide_claim_path(&self.input_at(at_ms))
    }

    /// The decision for one claim of `key` at `at_ms`: counted by path and
    /// reason, logged as `gate.decide` (at info when it differs from the
    /// previous decision), and under dry-run the intended journal claim is
    /// logged. The caller keeps it for the whole claim.
    pub fn decide_for_claim(&self, key: &str, at_ms: u64) -> Decision {
        let decision = self.decide_at(at_ms);
        let path = decision.path.as_str();
        let reason = decision.reason.to_string();
        self.inner
            .journal
            .metrics()
            .gate_decisions
            .get_or_create(&GateLabels {
                path: path.to_string(),
                reason: decision.reason.label().to_string(),
            })
            .inc();
        let changed = match self.inner.last_decision.lock() {
            Ok(mut last) => {
                let now = Some((decision.path, reason.clone()));
                let changed = *last != now;
                *last = now;
                changed
            }
            Err(_) => true,
        };
        if changed {
            tracing::info!(
                event = "gate.decide",
                node = self.node_id(),
                key,
                path,
                intended = decision.intended.as_str(),
                reason = %reason,
                "claim path changed"
            );
        } else {
            tracing::debug!(event = "gate.decide", key, path, reason = %reason, "claim path");
        }
        if decision.path != decision.intended {
            tracing::info!(
                event = "gate.decide",
                node = self.node_id(),
                dry_run = true,
                intended_claim = key,
                intended = decision.intended.as_str(),
                "dry-run: would claim on the journal; claiming on the bus"
            );
        }
        decision
    }

    /// This node's advert as of now.
    pub fn own_advert(&self) -> v1::Advert {
        let state = self.flag_state();
        let metrics = self.inner.journal.raft().metrics().borrow().clone();
        v1::Advert {
            node_id: self.node_id(),
            version: self.inner.config.version.clone(),
            journal_lease: Some(state.current.advertised_journal_lease()),
            dry_run: state.current.journal_lease_dry_run,
            draining: self.inner.journal.is_draining(),
            role: role_name(metrics.state).to_string(),
            sent_at_ms: self.inner.journal.clock().now_ms(),
            journal_lease_since_ms: state.since_ms,
            journal_lease_before: Some(state.before.advertised_journal_lease()),
            log_format: leasehold_core::command::LOG_FORMAT,
            wire_format: leasehold_raft::envelope::WIRE_FORMAT,
        }
    }

    /// Tells the peer links which envelope layout each member reads, by
    /// the adverts heard (kept across restarts); a member not heard from
    /// is sent JSON.
    fn publish_peer_wires(&self) {
        let entries = self.inner.registry.snapshot().unwrap_or_default();
        let wires = self.inner.journal.peers().wires();
        for (id, _) in self.membership() {
            if let Some(entry) = entries.get(&id) {
                wires.set(id, entry.advert.wire_format);
            }
        }
    }

    /// The newest log format every member decodes, by the adverts heard
    /// (kept across restarts): what the journal may write.
    pub fn log_format(&self) -> u32 {
        self.members_log_format(None)
    }

    /// [`Gate::log_format`], with a member not heard counted as format 1
    /// rather than current: what the edge may form commands in
    /// ([`Journal::heard_log_format`]).
    pub fn heard_log_format(&self) -> u32 {
        self.members_log_format(Some(0))
    }

    /// The least format of this build and every other member, `unheard`
    /// standing for a member whose advert was never heard.
    fn members_log_format(&self, unheard: Option<u32>) -> u32 {
        let entries = self.inner.registry.snapshot().unwrap_or_default();
        let me = self.node_id();
        let others = self.membership().into_iter().map(|(id, _)| id).filter(|id| *id != me);
        log_format_of(others, &entries, unheard)
    }

    fn count_rejection(&self, kind: &str, reason: &str) {
        self.inner
            .journal
            .metrics()
            .peer_rejected
            .get_or_create(&RejectLabels { kind: kind.to_string(), reason: reason.to_string() })
            .inc();
    }

    /// Takes a peer's signed advert delivered by `sender`; a bad one is
    /// dropped, counted and logged (`gate.advert_rejected`).
    pub fn accept_advert(&self, signed: &v1::Signed, sender: Sender) -> Result<u64, Rejection> {
        let now_ms = self.inner.journal.clock().now_ms();
        let result =
            self.inner.registry.accept(self.secret(), signed, sender, Instant::now(), now_ms);
        match result {
            Ok(_) => {
                self.inner.journal.metrics().adverts_accepted.inc();
            }
            Err(rejection) => {
                self.count_rejection("advert", rejection.label());
                tracing::warn!(
                    event = "gate.advert_rejected",
                    kind = "advert",
                    reason = rejection.label(),
                    sender = sender.node,
                    "dropped a peer advert"
                );
            }
        }
        result
    }

    /// Total peer messages dropped by this node.
    pub fn rejected_total(&self) -> u64 {
        // Sum over the label sets this node can produce.
        let family = &self.inner.journal.metrics().peer_rejected;
        let mut total = 0;
        for kind in ["advert", "bus"] {
            for reason in ["bad_mac", "malformed", "from_self", "replay", "not_sender"] {
                let labels = RejectLabels { kind: kind.to_string(), reason: reason.to_string() };
                total += family.get_or_create(&labels).get();
            }
        }
        total
    }

    /// Answers a peer's signed bus message delivered by `sender`, or why
    /// it was refused (dropped, counted and logged).
    pub fn serve_bus(
        &self,
        signed: &v1::Signed,
        sender: Sender,
    ) -> Result<v1::BusReply, BusRefusal> {
        let now_ms = self.inner.journal.clock().now_ms();
        let message = bus::open(self.secret(), signed, sender, now_ms).inspect_err(|refusal| {
            self.count_rejection("bus", refusal.label());
            tracing::warn!(
                event = "gate.advert_rejected",
                kind = "bus",
                reason = refusal.label(),
                sender = sender.node,
                "dropped a bus message"
            );
        })?;
        self.inner.bus.serve(message, now_ms).map_err(BusRefusal::Store)
    }

    /// The peers (id, address) whose advert says they are online.
    fn online_peers(&self) -> Vec<(u64, String)> {
        let online_ms = self.inner.config.interval_ms().saturating_mul(3);
        let entries = self.inner.registry.snapshot().unwrap_or_default();
        let now = Instant::now();
        self.membership()
            .into_iter()
            .filter(|(id, _)| {
                *id != self.node_id() && entries.get(id).is_some_and(|e| e.age_ms(now) < online_ms)
            })
            .collect()
    }

    /// The members this node hears now: itself, and the peers whose
    /// advert is younger than three intervals.
    pub fn online_members(&self) -> BTreeSet<u64> {
        let mut online: BTreeSet<u64> = self.online_peers().into_iter().map(|(id, _)| id).collect();
        online.insert(self.node_id());
        online
    }

    /// The members a `target = each` tick whose job carries `tags` goes
    /// to, split into the live ones (this node, and peers whose advert is
    /// younger than three intervals) and those away: down, or draining.
    /// Core picks the registered members with every tag; liveness is this
    /// node's view of the adverts. A member away is recorded as skipped
    /// and keeps its last instance watched (overlap = skip), so it gets no
    /// second one beside it when it is back.
    pub fn each_targets(&self, tags: &[String]) -> (Vec<u64>, Vec<u64>) {
        let (candidates, draining) = self.inner.journal.each_members(tags);
        let online: BTreeSet<u64> = self.online_peers().into_iter().map(|(id, _)| id).collect();
        let me = self.node_id();
        let (live, mut away): (Vec<u64>, Vec<u64>) =
            candidates.into_iter().partition(|id| *id == me || online.contains(id));
        away.extend(draining);
        away.sort_unstable();
        away.dedup();
        (live, away)
    }

    async fn broadcast(&self, message: v1::BusMessage) -> Vec<(u64, v1::BusReply)> {
        let signed = bus::seal(self.secret(), &message);
        let window = self.inner.config.bus_window;
        let sends = self.online_peers().into_iter().map(|(id, addr)| {
            let channel = self.inner.journal.peers().channel(&addr);
            let signed = signed.clone();
            async move {
                let mut client = PeerClient::new(channel.ok()?);
                let mut request = tonic::Request::new(signed);
                request.set_timeout(window);
                addressed_to(&mut request, id);
                let reply = tokio::time::timeout(window, client.bus(request)).await.ok()?;
                match reply {
                    Ok(reply) => Some((id, reply.into_inner())),
                    Err(status) => {
                        tracing::debug!(peer = id, error = %status.message(), "bus message not answered");
                        None
                    }
                }
            }
        });
        futures::future::join_all(sends).await.into_iter().flatten().collect()
    }

    /// Claims `key` on the bus: records the claim, sends it to every online
    /// peer, waits the collection window, and judges. Counted by outcome.
    pub async fn bus_claim(&self, key: &str) -> Result<Outcome, BusError> {
        let started = tokio::time::Instant::now();
        let now_ms = self.inner.journal.clock().now_ms();
        let claim = v1::BusClaim { key: key.to_string(), node: self.node_id(), at_ms: now_ms };
        let result = async {
            self.inner.bus.record_claim(&claim, now_ms)?;
            let message = v1::BusMessage { kind: Some(v1::bus_message::Kind::Claim(claim)) };
            for (_, answer) in self.broadcast(message).await {
                self.inner.bus.merge(key, &answer, self.inner.journal.clock().now_ms())?;
            }
            tokio::time::sleep_until(started + self.inner.config.bus_window).await;
            self.inner.bus.outcome(key)
        }
        .await;
        let outcome = match &result {
            Ok(Outcome::Won) => "won",
            Ok(Outcome::Lost { .. }) => "lost",
            Err(_) => "failed",
        };
        self.inner
            .journal
            .metrics()
            .bus_claims
            .get_or_create(&OutcomeLabels { outcome: outcome.to_string() })
            .inc();
        result
    }

    /// Releases `key` on the bus if this node holds it (a no-op otherwise):
    /// marks it released here and tells every online peer.
    pub async fn bus_release(&self, key: &str) -> Result<bool, BusError> {
        if !self.inner.bus.holds(key)? {
            return Ok(false);
        }
        let now_ms = self.inner.journal.clock().now_ms();
        self.inner.bus.record_release(key, self.node_id(), now_ms)?;
        let release = v1::BusRelease {
            key: key.to_string(),
            node: self.node_id(),
            at_ms: self.inner.journal.clock().now_ms(),
        };
        self.broadcast(v1::BusMessage { kind: Some(v1::bus_message::Kind::Release(release)) })
            .await;
        tracing::info!(event = "lease.release", path = "bus", key, "released on the bus");
        Ok(true)
    }

    /// The gate's part of `cluster status`: the decision now, and the
    /// adverts held.
    pub fn status(&self) -> (v1::GateStatus, Vec<v1::PeerAdvert>) {
        let now_ms = self.inner.journal.clock().now_ms();
        let decision = self.decide_at(now_ms);
        let flags = self.flags();
        let gate = v1::GateStatus {
            path: decision.path.as_str().to_string(),
            reason: decision.reason.to_string(),
            intended: decision.intended.as_str().to_string(),
            reason_label: decision.reason.label().to_string(),
            journal_lease: flags.journal_lease,
            dry_run: flags.journal_lease_dry_run,
        };
        let online_ms = self.inner.config.interval_ms().saturating_mul(3);
        let now = Instant::now();
        let adverts = self
            .inner
            .registry
            .snapshot()
            .unwrap_or_default()
            .into_values()
            .map(|entry| {
                let age_ms = entry.age_ms(now);
                let advert = entry.advert;
                v1::PeerAdvert {
                    node_id: advert.node_id,
                    version: advert.version,
                    journal_lease: advert.journal_lease,
                    dry_run: advert.dry_run,
                    draining: advert.draining,
                    role: advert.role,
                    age_ms,
                    online: age_ms < online_ms,
                }
            })
            .collect();
        (gate, adverts)
    }
}

/// How long old bus records are kept.
const BUS_RETENTION_MS: u64 = 3_600_000;

/// Sends this node's advert to every other member every interval (and at
/// once when the flags change), until `shutdown` turns true. Also prunes
/// the registry and the bus table now and then.
pub async fn run_adverts(gate: Gate, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(gate.inner.config.advert_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut rounds: u64 = 0;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.changed() => return,
            _ = tick.tick() => {}
            _ = gate.inner.flags_changed.notified() => {}
        }
        if *shutdown.borrow() {
            return;
        }
        // What every member decodes can change with membership and with
        // each advert; once a round is often enough (a member that joins
        // was checked at its join).
        gate.inner.journal.set_log_format(gate.log_format());
        gate.inner.journal.set_heard_log_format(gate.heard_log_format());
        gate.publish_peer_wires();
        send_adverts(&gate).await;
        rounds += 1;
        if rounds.is_multiple_of(60) {
            let members: Vec<u64> = gate.membership().into_iter().map(|(id, _)| id).collect();
            gate.inner.registry.prune(&members, gate.inner.config.stale_after_ms, Instant::now());
            let before_ms = gate.inner.journal.clock().now_ms().saturating_sub(BUS_RETENTION_MS);
            if let Err(error) = gate.inner.bus.prune(before_ms) {
                tracing::warn!(%error, "pruning the bus table failed");
            }
        }
    }
}

/// One round of adverts, sent concurrently, each bounded by the interval.
async fn send_adverts(gate: &Gate) {
    let signed = adverts::seal(gate.secret(), &gate.own_advert());
    let timeout = gate.inner.config.advert_interval;
    let me = gate.node_id();
    let sends = gate.membership().into_iter().filter(|(id, _)| *id != me).map(|(id, addr)| {
        let channel = gate.inner.journal.peers().channel(&addr);
        let signed = signed.clone();
        let journal = gate.inner.journal.clone();
        async move {
            let Ok(channel) = channel else { return };
            let mut request = tonic::Request::new(signed);
            request.set_timeout(timeout);
            // Named, so a member's address that reaches another node is
            // refused there rather than answered with that node's clock.
            addressed_to(&mut request, id);
            let mut client = PeerClient::new(channel);
            // The round trip measures the peer's clock (see clock_watch),
            // on the runtime's monotonic clock, which the watch ages by.
            let sent_wall_ms = journal.clock().now_ms();
            let sent_at = tokio::time::Instant::now();
            match tokio::time::timeout(timeout, client.advertise(request)).await {
                Ok(Ok(reply)) => {
                    let peer_now_ms = reply.into_inner().now_ms;
                    if peer_now_ms != 0 {
                        journal.clock_watch().record(
                            id,
                            sent_wall_ms,
                            sent_at,
                            tokio::time::Instant::now(),
                            peer_now_ms,
                        );
                    }
                }
                Ok(Err(status)) => {
                    tracing::debug!(peer = id, error = %status.message(), "advert not taken")
                }
                Err(_) => tracing::debug!(peer = id, "advert timed out"),
            }
        }
    });
    futures::future::join_all(sends).await;
}

/// Names `target` as the node `request` is meant for (the recipient
/// refuses it if it is another).
fn addressed_to<T>(request: &mut tonic::Request<T>, target: u64) {
    request.metadata_mut().insert(
        leasehold_security::secret::TARGET_NODE_HEADER,
        tonic::metadata::AsciiMetadataValue::from(target),
    );
}

/// The least log format of this build and each of `members` by its kept
/// advert, `unheard` standing for a member none was heard from (`None`:
/// assumed current; `Some(0)`: format 1).
fn log_format_of(
    members: impl Iterator<Item = u64>,
    entries: &BTreeMap<u64, adverts::Entry>,
    unheard: Option<u32>,
) -> u32 {
    let formats =
        members.map(|id| entries.get(&id).map(|entry| entry.advert.log_format).or(unheard));
    leasehold_core::command::agreed_log_format(leasehold_core::command::LOG_FORMAT, formats)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A member never heard is assumed current for what a leader writes,
    /// and taken as format 1 for what the edge may form; a heard member's
    /// own format counts for both.
    #[test]
    fn a_member_not_heard_holds_back_only_the_heard_format() {
        let now = Instant::now();
        let heard = |node_id: u64, log_format: u32| {
            let advert = v1::Advert { node_id, log_format, ..Default::default() };
            (node_id, adverts::Entry { advert, received: now, order_ms: 0 })
        };
        let current = leasehold_core::command::LOG_FORMAT;
        let entries = BTreeMap::from([heard(2, current), heard(3, 5)]);
        assert_eq!(log_format_of([2].into_iter(), &entries, None), current);
        assert_eq!(log_format_of([2].into_iter(), &entries, Some(0)), current);
        assert_eq!(log_format_of([2, 4].into_iter(), &entries, None), current, "4 assumed current");
        assert_eq!(log_format_of([2, 4].into_iter(), &entries, Some(0)), 1, "4 not heard");
        assert_eq!(log_format_of([2, 3].into_iter(), &entries, None), 5);
        assert_eq!(log_format_of([2, 3].into_iter(), &entries, Some(0)), 5);
    }

    #[test]
    fn a_node_outside_the_membership_counts_only_while_fresh() {
        let now = Instant::now();
        let heard = |node_id: u64, ago_ms: u64| {
            let advert = v1::Advert { node_id, ..Default::default() };
            let received = now.checked_sub(Duration::from_millis(ago_ms)).unwrap_or(now);
            (node_id, adverts::Entry { advert, received, order_ms: 0 })
        };
        // Members 1 and 2 (2 long silent); 4 removed a minute ago, its advert
        // kept on disk; 5 an older scheduler beside the cluster, heard now.
        let entries = BTreeMap::from([heard(2, 60_000), heard(4, 60_000), heard(5, 1_000)]);
        let counted = counted_nodes([1, 2].into_iter(), &entries, now, 30_000);
        assert_eq!(counted, BTreeSet::from([1, 2, 5]));
    }
}
