//! Goal: a leader that sent a batch to its followers ahead of its own sync
//! (replication ahead), lost it (the sync failed on a full disk) and
//! restarted never reuses that batch's log ids for other entries: every
//! replica holds the same entry at each committed index and the same state
//! at each applied index. (The chaos harness's disk-full regression plan,
//! seed 205147049, diverged this way before the fix: docs/decisions.md,
//! "Replication ahead".)
//!
//! Method: three in-process nodes, replication ahead on, node 1 leading
//! with its data dir on a 16 MiB tmpfs. The tmpfs is filled with a ballast
//! file until ENOSPC; a write A proposed on node 1 reaches both followers
//! ahead, and node 1's own write of it fails, which stops its Raft. The
//! ballast is removed and node 1 restarted on its data dir before the
//! followers' election timeout. openraft 0.9 would start it as leader of
//! its old term again (its stored vote was its own, committed) and give
//! the next write, B, A's log id; the followers, holding an entry with that
//! id, would keep A. With the vote read back uncommitted, node 1 starts as
//! a follower and the cluster elects a leader of a later term, which keeps
//! A or drops it everywhere. The test writes B through whichever node
//! leads, then compares the entry at A's index and the digests.
//! Mutation: with the stored vote read back committed, it fails (entry
//! A's index holds B on node 1 and A on the others).
//!
//! Mounting needs root; where it is refused the test says so and passes
//! (as the storage crate's disk-full test does).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};
use leasehold_core::{Command, JobSpec, Proposal};
use leasehold_node::NodeHandle;
use leasehold_node::config::{Config, SecretText};
use openraft::RaftLogReader;
use support::{last_index, phase, start, wait_for};

mod support;

fn config(id: u64, dir: &Path, grpc: String, http: String, join: Option<String>) -> Config {
    Config {
        id,
        grpc,
        http,
        data: dir.join(format!("node-{id}")),
        join,
        heartbeat_ms: 100,
        // Node 1 is down for a moment; the followers must not elect
        // meanwhile, so that it is the restarted node that could resume.
        election_timeout_min_ms: 3_000,
        election_timeout_max_ms: 4_000,
        executor: false,
        sweep_interval_ms: 3_600_000,
        cluster_secret: Some(SecretText("ahead-enospc-test-secret-0123456789".into())),
        replicate_ahead: true,
        ..Config::default()
    }
}

fn applied_index(node: &NodeHandle) -> u64 {
    node.raft().metrics().borrow().last_applied.map_or(0, |l| l.index)
}

fn enqueue(tag: &str) -> Proposal {
    // A payload larger than a page, so the write cannot fit in the slack
    // of the chunk file's last tmpfs page.
    let job = JobSpec {
        queue: "q".into(),
        payload: vec![tag.as_bytes()[0]; 64 * 1024],
        idempotency_key: Some(tag.into()),
        ..JobSpec::default()
    };
    Proposal { now_ms: 0, command: Command::Enqueue { jobs: vec![job] } }
}

/// A tmpfs mounted for the test's life, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts one of `size_mb` MiB on `dir`; `None` where mounting is
    /// refused (not root).
    fn mount(dir: &Path, size_mb: u64) -> Result<Option<Tmpfs>> {
        std::fs::create_dir_all(dir)?;
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_mb}m,mode=0755"), "tmpfs"])
            .arg(dir)
            .output()?;
        if !out.status.success() {
            eprintln!(
                "restarted-leader test skipped: cannot mount a tmpfs here ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            return Ok(None);
        }
        Ok(Some(Tmpfs(dir.to_path_buf())))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).output();
    }
}

const BALLAST: &str = "ballast";

fn fill(dir: &Path) -> Result<u64> {
    let mut file = std::fs::File::create(dir.join(BALLAST))?;
    let block = vec![0xaa_u8; 4096];
    let mut written = 0;
    loop {
        match file.write(&block) {
            Ok(0) => return Ok(written),
            Ok(n) => written += n as u64,
            Err(e) if e.raw_os_error() == Some(28) => return Ok(written),
            Err(e) => return Err(e.into()),
        }
    }
}

async fn entry_at(node: &NodeHandle, index: u64) -> Result<String> {
    let mut reader = node.log_store().clone();
    let entries = reader.try_get_log_entries(index..=index).await?;
    let entry = entries.first().context("no entry")?;
    let what = match &entry.payload {
        openraft::EntryPayload::Normal(p) => match &p.command {
            Command::Enqueue { jobs } => format!("enqueue {:?}", jobs[0].idempotency_key),
            other => format!("{other:?}").chars().take(40).collect(),
        },
        other => format!("{other:?}").chars().take(40).collect(),
    };
    Ok(format!("{} {}", entry.log_id, what))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_that_lost_a_batch_it_sent_ahead_does_not_reuse_its_log_ids() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let Some(disk) = Tmpfs::mount(&dir.path().join("node-1"), 16)? else { return Ok(()) };

    // Fixed addresses, so node 1 comes back where its peers know it.
    let mut addrs = BTreeMap::new();
    for id in 1..=3_u64 {
        let port = || leasehold_testkit::free_port([127, 0, 0, 1].into());
        addrs.insert(id, (format!("127.0.0.1:{}", port()?), format!("127.0.0.1:{}", port()?)));
    }
    let cfg = |id: u64, join: Option<String>| {
        let (g, h) = addrs[&id].clone();
        config(id, dir.path(), g, h, join)
    };

    phase("start node 1, then 2 and 3 joining it");
    let first = start(cfg(1, None)).await?;
    let member = first.grpc_addr().to_string();
    let mut nodes = BTreeMap::from([(1, first)]);
    nodes.insert(2, start(cfg(2, Some(member.clone()))).await?);
    nodes.insert(3, start(cfg(3, Some(member))).await?);
    wait_for("three voters in step", Duration::from_secs(30), || {
        let m = nodes[&1].raft().metrics().borrow().clone();
        m.membership_config.membership().voter_ids().count() == 3
            && m.replication.as_ref().is_some_and(|r| {
                r.len() == 3 && r.values().all(|x| x.map(|x| x.index) == m.last_log_index)
            })
    })
    .await?;
    let term = nodes[&1].raft().metrics().borrow().current_term;

    phase("fill node 1's disk; propose A on node 1");
    let ballast = fill(&disk.0)?;
    eprintln!("ballast {} KiB", ballast / 1024);
    let target = last_index(&nodes[&1]) + 1;
    let raft1 = nodes[&1].raft().clone();
    let write_a = tokio::spawn(async move { raft1.client_write(enqueue("A")).await });

    wait_for("both followers hold A", Duration::from_secs(3), || {
        last_index(&nodes[&2]) >= target && last_index(&nodes[&3]) >= target
    })
    .await?;
    eprintln!(
        "last log index per node: {:?}",
        nodes.iter().map(|(id, n)| (*id, last_index(n))).collect::<Vec<_>>()
    );
    let failed = tokio::time::timeout(Duration::from_secs(3), nodes[&1].raft_failed())
        .await
        .context("node 1's core did not stop on ENOSPC")?;
    eprintln!("node 1 core stopped: {failed}");
    eprintln!("write A answered: {:?}", write_a.await?.map(|w| w.log_id));

    phase("remove the ballast; restart node 1 on its data dir");
    let node1 = nodes.remove(&1).context("node 1")?;
    let _ = node1.shutdown(Duration::from_secs(2)).await;
    std::fs::remove_file(disk.0.join(BALLAST))?;
    let deadline = Instant::now() + Duration::from_secs(8);
    let node1 = loop {
        match start(cfg(1, None)).await {
            Ok(node) => break node,
            Err(e) if Instant::now() < deadline => {
                eprintln!("restart: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    nodes.insert(1, node1);
    eprintln!(
        "node 1 back: last log {:?}, term {} (was {term}), state {:?}",
        nodes[&1].raft().metrics().borrow().last_log_index,
        nodes[&1].raft().metrics().borrow().current_term,
        nodes[&1].raft().metrics().borrow().state,
    );

    phase("propose B on the leader");
    let mut leader = 0;
    wait_for("a leader", Duration::from_secs(20), || {
        leader = nodes
            .iter()
            .find(|(_, n)| n.raft().metrics().borrow().state == openraft::ServerState::Leader)
            .map_or(0, |(id, _)| *id);
        leader != 0
    })
    .await?;
    eprintln!(
        "leader: node {leader}, term {}",
        nodes[&leader].raft().metrics().borrow().current_term
    );
    let written = tokio::time::timeout(
        Duration::from_secs(5),
        nodes[&leader].raft().client_write(enqueue("B")),
    )
    .await
    .context("write B")?
    .map_err(|e| anyhow!("write B: {e}"))?;
    eprintln!("write B committed at {}", written.log_id);

    let last = written.log_id.index;
    wait_for("all applied B's index, and the same index", Duration::from_secs(5), || {
        let applied: Vec<u64> = nodes.values().map(applied_index).collect();
        applied.iter().all(|a| *a >= last && *a == applied[0])
    })
    .await?;
    let mut entries = BTreeMap::new();
    for (id, node) in &nodes {
        entries.insert(*id, entry_at(node, target).await?);
    }
    // Each node's digest with the applied index it was taken at (one read
    // of the store), until all three are at the same index: the nodes keep
    // proposing on their own (the leader's time stamps, registrations), so
    // an applied index read apart from the state can be one entry off.
    let deadline = Instant::now() + Duration::from_secs(10);
    let digests = loop {
        let mut digests = BTreeMap::new();
        for (id, node) in &nodes {
            let taken = node.journal().state_machine().recent_digest().await?;
            let taken = taken.context("no digest taken")?;
            digests.insert(*id, (taken.index, taken.digest));
        }
        let first = digests.values().next().map(|(index, _)| *index);
        if digests.values().all(|(index, _)| Some(*index) == first) {
            break digests;
        }
        if Instant::now() > deadline {
            return Err(anyhow!("no applied index shared by all three within 10 s: {digests:x?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("entry {target} per node: {entries:#?}");
    eprintln!("(applied, digest) per node: {digests:x?}");

    for (_, node) in nodes {
        let _ = node.shutdown(Duration::from_secs(2)).await;
    }
    drop(disk);

    let first = entries.values().next().cloned();
    assert!(
        entries.values().all(|e| Some(e) == first.as_ref()),
        "committed entry {target} differs between replicas: {entries:?}"
    );
    let first = digests.values().next().copied();
    assert!(
        digests.values().all(|d| Some(*d) == first),
        "replicas at the same applied index have different states: {digests:x?}"
    );
    Ok(())
}
