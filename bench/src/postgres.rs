//! PostgreSQL as a job queue, the `FOR UPDATE SKIP LOCKED` way:
//!
//! - enqueue: `INSERT` one ready row;
//! - claim: one `UPDATE … WHERE id = (SELECT … FOR UPDATE SKIP LOCKED LIMIT 1)
//!   RETURNING id, token`, the token drawn from a sequence;
//! - ack: `UPDATE … SET state = 'acked' WHERE id = $1 AND token = $2`.
//!
//! Jobs carry tags the way leasehold's do, as the strongest fair schema a
//! competent user would write for them: a canonical tag-set column
//! (`tag_key`, the sorted, deduplicated tags joined; `''` for none) that
//! leads the partial ready index, so a claim reads only the index range of
//! the tag sets its worker may take, as leasehold's claim reads only those
//! groups. The workload's jobs and claims are untagged (`tag_key = ''`); a
//! backlog ([`Postgres::fill_backlog`]) is rows with `tag_key = 'absent'`,
//! which the claim's range never reaches.
//!
//! Every statement is its own transaction (autocommit), so each commit waits
//! for its WAL flush under the server's `fsync = on`, `synchronous_commit =
//! on` (concurrent commits share flushes, as PostgreSQL's group commit does).
//! With two synchronous standbys (`synchronous_standby_names = 'ANY 1 (s1,
//! s2)'`) a commit also waits until one of them has flushed its WAL; the
//! clients all talk to the primary, with the same statements.

use tokio_postgres::{Client, NoTls, Statement};

use crate::measure::{Claimed, Connection, Target};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS jobs (
    id          bigserial PRIMARY KEY,
    queue       text        NOT NULL,
    payload     bytea       NOT NULL,
    priority    integer     NOT NULL DEFAULT 0,
    state       text        NOT NULL DEFAULT 'ready',
    lease_until timestamptz,
    token       bigint,
    tag_key     text        NOT NULL DEFAULT '',
    enqueued_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS jobs_ready ON jobs (tag_key, priority DESC, id) WHERE state = 'ready';
CREATE SEQUENCE IF NOT EXISTS claim_tokens;
";

const ENQUEUE: &str = "INSERT INTO jobs (queue, payload, priority) VALUES ('bench', $1, 0)";
const CLAIM: &str = "
UPDATE jobs SET state = 'claimed', lease_until = now() + interval '30 seconds',
                token = nextval('claim_tokens')
 WHERE id = (SELECT id FROM jobs WHERE state = 'ready' AND tag_key = ''
              ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED)
RETURNING id, token";
/// The backlog in one statement (one transaction): `$2` rows of payload `$1`
/// with a tag set no claim takes, in the workload's queue and priority.
const BACKLOG: &str = "
INSERT INTO jobs (queue, payload, priority, tag_key)
SELECT 'bench', $1::bytea, 0, 'absent' FROM generate_series(1, $2::bigint)";
const BACKLOG_READY: &str =
    "SELECT count(*) FROM jobs WHERE state = 'ready' AND tag_key = 'absent'";
const STANDBYS_STREAMING: &str = "SELECT count(*) FROM pg_stat_replication \
     WHERE state = 'streaming' AND sync_state = 'quorum'";
const ACK: &str = "UPDATE jobs SET state = 'acked' WHERE id = $1 AND token = $2";

/// A PostgreSQL server at one loopback address.
pub struct Postgres {
    config: String,
}

impl Postgres {
    /// The server at `addr` (`host:port`), database `postgres`, as `user`.
    pub fn new(addr: &str, user: &str) -> Postgres {
        let (host, port) = addr.rsplit_once(':').unwrap_or((addr, "5432"));
        Postgres { config: format!("host={host} port={port} user={user} dbname=postgres") }
    }

    async fn open(&self) -> anyhow::Result<Client> {
        let (client, connection) = tokio_postgres::connect(&self.config, NoTls).await?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                eprintln!("postgres connection: {error}");
            }
        });
        Ok(client)
    }

    /// Succeeds once the server accepts a query.
    pub async fn probe(&self) -> anyhow::Result<()> {
        self.open().await?.simple_query("SELECT 1").await?;
        Ok(())
    }

    /// Inserts `jobs` backlog rows of `payload_bytes` bytes in one committed
    /// statement, reads their count back, and refreshes the planner's
    /// statistics (as autovacuum would soon after a bulk load), so the
    /// window starts from a settled table rather than an ANALYZE inside it.
    pub async fn fill_backlog(&self, jobs: usize, payload_bytes: usize) -> anyhow::Result<()> {
        let client = self.open().await?;
        let payload = vec![0x5a_u8; payload_bytes];
        let wanted = i64::try_from(jobs)?;
        let inserted = client.execute(BACKLOG, &[&payload, &wanted]).await?;
        anyhow::ensure!(inserted == u64::try_from(jobs)?, "backlog inserted {inserted} rows");
        let ready: i64 = client.query_one(BACKLOG_READY, &[]).await?.try_get(0)?;
        anyhow::ensure!(ready == wanted, "after a backlog of {jobs} rows, {ready} are ready");
        client.batch_execute("ANALYZE jobs").await?;
        Ok(())
    }

    /// Succeeds once at least `standbys` standbys stream from this primary
    /// as quorum-synchronous ones (`synchronous_standby_names = 'ANY 1 (…)'`
    /// lists them all as `quorum`); at once when `standbys` is 0.
    pub async fn standbys_streaming(&self, standbys: u32) -> anyhow::Result<()> {
        if standbys == 0 {
            return Ok(());
        }
        let client = self.open().await?;
        let streaming: i64 = client.query_one(STANDBYS_STREAMING, &[]).await?.try_get(0)?;
        anyhow::ensure!(
            streaming >= i64::from(standbys),
            "{streaming} of {standbys} standbys stream as quorum-synchronous"
        );
        Ok(())
    }

    /// Creates the table, its ready-index and the token sequence.
    pub async fn create_schema(&self) -> anyhow::Result<()> {
        self.open().await?.batch_execute(SCHEMA).await?;
        Ok(())
    }
}

/// One benchmark client's PostgreSQL session, statements prepared.
pub struct PostgresConn {
    client: Client,
    enqueue: Statement,
    claim: Statement,
    ack: Statement,
}

impl Target for Postgres {
    type Conn = PostgresConn;

    async fn connect(&self, _index: usize) -> anyhow::Result<PostgresConn> {
        let client = self.open().await?;
        let enqueue = client.prepare(ENQUEUE).await?;
        let claim = client.prepare(CLAIM).await?;
        let ack = client.prepare(ACK).await?;
        Ok(PostgresConn { client, enqueue, claim, ack })
    }
}

impl Connection for PostgresConn {
    async fn enqueue(&mut self, payload: &[u8]) -> anyhow::Result<()> {
        let inserted = self.client.execute(&self.enqueue, &[&payload]).await?;
        anyhow::ensure!(inserted == 1, "enqueue inserted {inserted} rows");
        Ok(())
    }

    async fn claim(&mut self) -> anyhow::Result<Claimed> {
        let mut retries = 0;
        loop {
            // Every row the subquery saw may be locked by other claimers;
            // then it finds none and the claim tries again.
            if let Some(row) = self.client.query_opt(&self.claim, &[]).await? {
                let job_id: i64 = row.try_get(0)?;
                let token: i64 = row.try_get(1)?;
                return Ok(Claimed {
                    job_id: u64::try_from(job_id)?,
                    token: u64::try_from(token)?,
                    retries,
                });
            }
            retries += 1;
            tokio::task::yield_now().await;
        }
    }

    async fn ack(&mut self, claimed: Claimed) -> anyhow::Result<()> {
        let job_id = i64::try_from(claimed.job_id)?;
        let token = i64::try_from(claimed.token)?;
        let updated = self.client.execute(&self.ack, &[&job_id, &token]).await?;
        anyhow::ensure!(updated == 1, "ack of job {job_id} refused: stale token");
        Ok(())
    }
}
