//! The status page in a real browser (issue 16): a secure three-node
//! cluster (mutual TLS, tokens), headless Chromium driven through
//! chromedriver, the page of a follower.
//!
//! Goal: an operator who opens any node's `/` sees the members with their
//! roles and the leader, a queue's counts, a schedule's last fire and its
//! skips, and a lease expiry and its redelivery — and sees them change
//! without reloading. Method: the cluster's state is made through gRPC (a
//! schedule that fires every second, jobs enqueued, a lease left to lapse
//! and claimed again), and each fact is awaited in the rendered page and
//! compared with what gRPC answers. The JSON endpoint is asked without and
//! with a wrong token first: both are 401 with a JSON error. The page asks
//! for the reader token through its own form. The screenshot goes to
//! target/ (and to docs/status-page.png with LEASEHOLD_UPDATE_SCREENSHOT=1).
//!
//! Without Chromium and chromedriver the story is skipped with a message,
//! unless LEASEHOLD_REQUIRE_BROWSER=1 (CI), which makes it a failure.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use fantoccini::{Client as Browser, ClientBuilder, Locator};
use leasehold_proto::v1;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::cluster::cluster_slot;
use super::support::{
    Check, Cluster, ClusterOptions, RPC_TIMEOUT, Sandbox, deadline_in, dev_certs, enqueue_job,
    free_port, http_get, phase, wait_until,
};

/// The whole story's budget.
const STORY_BUDGET: Duration = Duration::from_secs(240);
/// How long the page may take to show a fact the cluster already holds
/// (it polls every second; a lease lapse needs its TTL and a sweep).
const PAGE_WITHIN: Duration = Duration::from_secs(30);
/// How long chromedriver may take to listen.
const DRIVER_WITHIN: Duration = Duration::from_secs(20);
/// Where Debian's packages put the browser and its driver.
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
/// The queue the story fills, and the schedule's own queue.
const QUEUE: &str = "emails";
/// The queue whose one job's lease is left to lapse.
const LAPSING: &str = "reports";
const TICKS: &str = "heartbeat-jobs";
const SCHEDULE: &str = "heartbeat";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_the_cluster_and_follows_it_live() -> Result<()> {
    let Some((chromium, chromedriver)) = browser_binaries()? else {
        return Ok(());
    };
    let _slot = cluster_slot().await?;
    let sandbox = Sandbox::new("status-page")?;
    sandbox.run(STORY_BUDGET, story(&sandbox, &chromium, &chromedriver)).await
}

/// The browser and driver, or `None` (skip) when they are missing and CI
/// did not ask for them.
fn browser_binaries() -> Result<Option<(PathBuf, PathBuf)>> {
    let chromium = std::env::var_os("LEASEHOLD_CHROMIUM").map_or(CHROMIUM.into(), PathBuf::from);
    let driver =
        std::env::var_os("LEASEHOLD_CHROMEDRIVER").map_or(CHROMEDRIVER.into(), PathBuf::from);
    let missing: Vec<String> = [&chromium, &driver]
        .iter()
        .filter(|path| !path.exists())
        .map(|path| path.display().to_string())
        .collect();
    if missing.is_empty() {
        return Ok(Some((chromium, driver)));
    }
    let message = format!(
        "the status page story needs {} (Debian packages chromium and chromium-driver)",
        missing.join(" and ")
    );
    if std::env::var("LEASEHOLD_REQUIRE_BROWSER").is_ok_and(|v| v == "1") {
        bail!("{message}; LEASEHOLD_REQUIRE_BROWSER=1 makes that a failure");
    }
    eprintln!("SKIPPED: {message}");
    Ok(None)
}

async fn story(sandbox: &Sandbox, chromium: &Path, chromedriver: &Path) -> Result<()> {
    phase("a secure three-node cluster (TLS, tokens) and its reader token");
    let certs = sandbox.path().join("certs");
    dev_certs(sandbox, &certs, 3).await?;
    let options = ClusterOptions { secure: Some(certs.clone()), ..Default::default() };
    let cluster = Cluster::start_with(sandbox, 3, options).await?;
    let reader = std::fs::read_to_string(certs.join("token-reader"))?.trim().to_string();
    let status = cluster.node(1)?.cluster_stub()?.status(v1::StatusRequest::default()).await?;
    let leader = status.into_inner().leader;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).context("a follower")?;
    let page_node = cluster.node(follower)?;
    let http = page_node.http;
    eprintln!("leader is node {leader}; the page is node {follower}'s at http://{http}/");

    phase("the JSON needs the token: none and a wrong one are 401 with a JSON error");
    let none = http_get(http, "/api/status").await?;
    ensure!(none.status == 401, "no token: {none:?}");
    let error: Value = serde_json::from_str(&none.body).context("the 401 body is JSON")?;
    let message = error["error"].as_str().unwrap_or_default();
    ensure!(message.contains("authorization") && message.contains("token"), "{error}");
    let wrong = http_get_with_token(http, "/api/status", "not-a-token").await?;
    ensure!(wrong.0 == 401 && wrong.1.contains("unknown token"), "wrong token: {wrong:?}");
    let right = http_get_with_token(http, "/api/status", &reader).await?;
    ensure!(right.0 == 200, "the reader token: {right:?}");
    // Both refusals are counted as the gRPC side's are, and logged with
    // the client's address.
    let metrics = super::lifecycle::scrape(http).await?;
    for reason in ["no_token", "unknown_token"] {
        let labels = [("service", "http.status"), ("reason", reason)];
        let refused = metrics.counter("leasehold_auth_refused_total", &labels)?;
        ensure!(refused == 1.0, "{reason}: {refused} refusals counted, expected 1");
    }
    let log = std::fs::read_to_string(page_node.log().context("the node keeps no log")?)?;
    let logged = log
        .lines()
        .filter(|line| line.contains("auth.refuse") && line.contains("GET /api/status"))
        .filter(|line| line.contains("127.0.0.1"))
        .count();
    ensure!(logged == 2, "{logged} status refusals logged with the client, expected 2");
    let shell = http_get(http, "/").await?;
    ensure!(shell.status == 200 && shell.content_type.starts_with("text/html"), "{shell:?}");
    ensure!(!shell.body.contains(QUEUE), "the shell carries no data");

    phase("a schedule firing every second, and three jobs in a queue");
    let mut schedules = page_node.schedules_stub()?;
    let spec = v1::ScheduleSpec {
        name: SCHEDULE.into(),
        cron: "* * * * * *".into(),
        template: Some(v1::JobTemplate { queue: Some(TICKS.into()), ..Default::default() }),
        ..Default::default()
    };
    schedules.put(v1::PutScheduleRequest { spec: Some(spec) }).await?;
    let mut queue = page_node.stub()?;
    for n in 0..3 {
        enqueue_job(&mut queue, QUEUE, format!("mail {n}").as_bytes()).await?;
    }

    phase("chromium opens the follower's page and is given the reader token");
    let browser = BrowserSession::start(sandbox, chromium, chromedriver).await?;
    let page = &browser.client;
    page.set_window_size(1400, 1100).await?;
    page.goto(&format!("http://{http}/")).await?;
    wait_page(page, "the page to ask for a token", |seen| {
        Ok(seen["token_form_shown"] == json!(true)
            && seen["problem"].as_str().is_some_and(|p| p.contains("token")))
    })
    .await?;
    // While it asks, the page does not repeat the refused request every
    // second: each would be counted and logged as a refusal.
    let no_token = [("service", "http.status"), ("reason", "no_token")];
    let asked =
        super::lifecycle::scrape(http).await?.counter("leasehold_auth_refused_total", &no_token)?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let later =
        super::lifecycle::scrape(http).await?.counter("leasehold_auth_refused_total", &no_token)?;
    ensure!(later == asked, "the page asking for a token was refused {} more times", later - asked);
    page.find(Locator::Id("token")).await?.send_keys(&reader).await?;
    page.find(Locator::Css("#token-form button")).await?.click().await?;
    let form = page.find(Locator::Id("token-form")).await?;
    wait_until("the token form to go once the token is taken", deadline_in(PAGE_WITHIN), || {
        let form = form.clone();
        async move {
            Ok(match form.is_displayed().await? {
                false => Check::Done(()),
                true => Check::NotYet("the token form is still displayed".into()),
            })
        }
    })
    .await?;
    // A marker on the window: gone if the page reloads.
    page.execute("window.storyMarker = 'not reloaded';", vec![]).await?;

    phase("members with their roles, the one leader, every node ready");
    let seen = wait_page(page, "three ready members and the leader", |seen| {
        let members = seen["members"].as_array().map(Vec::as_slice).unwrap_or_default();
        Ok(members.len() == 3
            && members.iter().all(|m| m["ready"] == json!("ready"))
            && seen["leader"] == json!(format!("node {leader}")))
    })
    .await?;
    let members = seen["members"].as_array().context("members")?;
    let ids: Vec<&str> = members.iter().filter_map(|m| m["id"].as_str()).collect();
    ensure!(ids == ["1", "2", "3"], "members {ids:?}");
    let leaders: Vec<&str> = members
        .iter()
        .filter(|m| m["role"] == json!("leader"))
        .filter_map(|m| m["id"].as_str())
        .collect();
    ensure!(leaders == [leader.to_string().as_str()], "leader rows {leaders:?}, leader {leader}");
    ensure!(members.iter().filter(|m| m["role"] == json!("follower")).count() == 2, "{members:?}");
    ensure!(seen["answering"] == json!(format!("node {follower}")), "{seen}");

    phase("the queue's counts, as gRPC answers them");
    let counts = wait_queue(page, QUEUE, |q| q["ready"] == json!("3")).await?;
    let stats = super::support::queue_stats(&mut queue, QUEUE).await?;
    ensure!(stats.ready == 3, "gRPC stats {stats:?}");
    ensure!(counts["claimed"] == json!("0") && counts["dead"] == json!("0"), "{counts}");
    ensure!(counts["delayed"] == json!("0"), "{counts}");

    phase("the schedule's last fire, and overlap skips of an unacked tick");
    let schedule = wait_page(page, "the schedule to have fired and then skipped", |seen| {
        let row = &seen["schedules"][SCHEDULE];
        Ok(row["last_fired_ms"].as_str().is_some_and(|ms| !ms.is_empty())
            && row["skips"].as_str().is_some_and(|s| s.contains("overlap")))
    })
    .await?;
    let row = &schedule["schedules"][SCHEDULE];
    let listed = schedules.list(v1::ListSchedulesRequest { stale: false }).await?.into_inner();
    let grpc =
        listed.schedules.iter().find(|s| s.spec.as_ref().is_some_and(|spec| spec.name == SCHEDULE));
    let grpc = grpc.context("the schedule in Schedules.List")?;
    let fired_ms = grpc.history.iter().find(|r| r.outcome == "fired").map(|r| r.bucket * 1_000);
    ensure!(
        row["last_fired_ms"] == json!(fired_ms.map(|ms| ms.to_string())),
        "page {row} against gRPC's first fire {fired_ms:?} (overlap skips every later tick)"
    );
    ensure!(row["fired"] == json!("1"), "{row}");
    ensure!(row["last_fired"].as_str().is_some_and(|t| t.contains("ago")), "{row}");

    phase("a lease left to lapse shows as an expiry, then as a redelivery");
    enqueue_job(&mut queue, LAPSING, b"monthly report").await?;
    let claimed = claim(&mut queue, "lapsing-worker", 1_000).await?;
    let lapsed = wait_page(page, "the lapsed lease among the expiries", |seen| {
        Ok(seen["expiries"][claimed.to_string()]["state"] == json!("ready"))
    })
    .await?;
    ensure!(lapsed["expiries"][claimed.to_string()]["attempts"] == json!("1"), "{lapsed}");
    let again = claim(&mut queue, "second-worker", 60_000).await?;
    ensure!(again == claimed, "the lapsed job {claimed} is the only one, got {again}");
    let redelivered = wait_page(page, "the redelivery", |seen| {
        Ok(seen["redeliveries"][claimed.to_string()]["holder"] == json!("second-worker"))
    })
    .await?;
    let row = &redelivered["redeliveries"][claimed.to_string()];
    ensure!(row["delivery"] == json!("2") && row["last_error"] == json!("lease expired"), "{row}");
    ensure!(
        redelivered["expiries"][claimed.to_string()]["state"] == json!("redelivered"),
        "{redelivered}"
    );

    phase("an enqueue through gRPC changes the page's count without a reload");
    wait_queue(page, LAPSING, |q| q["ready"] == json!("0") && q["claimed"] == json!("1")).await?;
    enqueue_job(&mut queue, QUEUE, b"one more").await?;
    wait_queue(page, QUEUE, |q| q["ready"] == json!("4")).await?;
    let marker = page.execute("return window.storyMarker || null;", vec![]).await?;
    ensure!(marker == json!("not reloaded"), "the page reloaded: {marker}");

    phase("a screenshot");
    let png = page.screenshot().await?;
    ensure!(png.starts_with(b"\x89PNG"), "the screenshot is not a PNG");
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    std::fs::write(&shot, &png).with_context(|| format!("writing {}", shot.display()))?;
    eprintln!("screenshot: {}", shot.display());
    if std::env::var("LEASEHOLD_UPDATE_SCREENSHOT").is_ok_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/status-page.png");
        std::fs::write(&docs, &png).with_context(|| format!("writing {}", docs.display()))?;
        eprintln!("screenshot also written to {}", docs.display());
    }
    browser.close().await
}

/// Claims one job of [`LAPSING`] as `worker` for `ttl_ms`; its id.
async fn claim(
    queue: &mut v1::queue_client::QueueClient<tonic::transport::Channel>,
    worker: &str,
    ttl_ms: u64,
) -> Result<u64> {
    let reply = queue
        .claim(v1::ClaimRequest {
            worker: worker.into(),
            queue: LAPSING.into(),
            max: 1,
            lease_ttl_ms: Some(ttl_ms),
            wait_ms: 5_000,
            ..Default::default()
        })
        .await
        .context("claim")?
        .into_inner();
    match reply.grants.as_slice() {
        [grant] => grant.job.as_ref().map(|job| job.id).context("a grant without its job"),
        other => bail!("claim granted {other:?}"),
    }
}

/// What the rendered page shows, read from its DOM as a user reads it.
const READ_PAGE: &str = r#"
const text = (id) => { const e = document.getElementById(id); return e ? e.textContent : null; };
const rows = (id) => Array.from(document.querySelectorAll('#' + id + ' tbody tr')).filter((r) => r.cells.length > 1);
const fields = (row) => {
  const out = {};
  for (const td of row.querySelectorAll('td[data-field]')) {
    out[td.dataset.field] = td.firstChild ? td.firstChild.textContent : '';
    if (td.dataset.ms) out[td.dataset.field + '_ms'] = td.dataset.ms;
  }
  return out;
};
const keyed = (id, key) => Object.fromEntries(rows(id).map((r) => [r.dataset[key], fields(r)]));
return {
  leader: text('leader'),
  answering: text('answering'),
  refreshes: Number(document.getElementById('updated').dataset.refreshes),
  problem: document.getElementById('problem').hidden ? null : text('problem'),
  token_form_shown: !document.getElementById('token-form').hidden,
  members: rows('members').map(fields),
  queues: keyed('queues', 'queue'),
  schedules: keyed('schedules', 'schedule'),
  expiries: keyed('expiries', 'jobId'),
  redeliveries: keyed('redeliveries', 'jobId'),
};
"#;

/// Waits until the page shows what `done` looks for; answers that view.
async fn wait_page(
    page: &Browser,
    what: &str,
    done: impl Fn(&Value) -> Result<bool>,
) -> Result<Value> {
    let done = &done;
    wait_until(what, deadline_in(PAGE_WITHIN), || async move {
        let seen = page.execute(READ_PAGE, vec![]).await.context("reading the page")?;
        Ok(if done(&seen)? { Check::Done(seen) } else { Check::NotYet(seen.to_string()) })
    })
    .await
}

/// Waits until the page's row of `queue` satisfies `done`; answers the row.
async fn wait_queue(page: &Browser, queue: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
    let what = format!("the page's {queue} counts");
    let seen = wait_page(page, &what, |seen| Ok(done(&seen["queues"][queue]))).await?;
    Ok(seen["queues"][queue].clone())
}

/// `GET path` with a bearer token; the status code and body.
async fn http_get_with_token(addr: SocketAddr, path: &str, token: &str) -> Result<(u16, String)> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        let request =
            format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\r\n");
        stream.write_all(request.as_bytes()).await?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await?;
        anyhow::Ok(String::from_utf8(raw)?)
    };
    let text = tokio::time::timeout(RPC_TIMEOUT, exchange)
        .await
        .map_err(|_| anyhow!("GET {path} on {addr}: no answer"))??;
    let (head, body) = text.split_once("\r\n\r\n").context("no end of headers")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok());
    Ok((code.context("a status line")?, body.to_string()))
}

/// chromedriver (in a process group of its own, with the Chromium it
/// starts) and a WebDriver session of headless Chromium on a fresh profile.
/// Dropping it kills the group, so a failing story leaves no browser.
struct BrowserSession {
    client: Browser,
    driver: DriverProcess,
}

/// The chromedriver process group, SIGKILLed on drop.
struct DriverProcess {
    child: Child,
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid: it leads the group it made.
        let group = Pid::from_raw(self.child.id() as i32);
        if let Err(error) = killpg(group, Signal::SIGKILL)
            && error != nix::errno::Errno::ESRCH
        {
            eprintln!("killing chromedriver's process group {group}: {error}");
        }
        let _ = self.child.wait();
    }
}

impl BrowserSession {
    async fn start(sandbox: &Sandbox, chromium: &Path, chromedriver: &Path) -> Result<Self> {
        let port = free_port()?;
        let log = sandbox.log_file("chromedriver");
        let out = std::fs::File::create(&log)?;
        let mut command = Command::new(chromedriver);
        command
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .process_group(0);
        let child =
            command.spawn().with_context(|| format!("starting {}", chromedriver.display()))?;
        let driver = DriverProcess { child };
        let url = format!("http://127.0.0.1:{port}");
        let profile = sandbox.path().join("chromium-profile");
        std::fs::create_dir_all(&profile)?;
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync",
                    "--disable-dev-shm-usage", "--window-size=1400,1100",
                    format!("--user-data-dir={}", profile.display()),
                ],
            }),
        );
        let client =
            wait_until("chromedriver to start a session", deadline_in(DRIVER_WITHIN), || {
                let capabilities = capabilities.clone();
                let url = url.clone();
                async move {
                    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
                    match ClientBuilder::new(connector)
                        .capabilities(capabilities)
                        .connect(&url)
                        .await
                    {
                        Ok(client) => Ok(Check::Done(client)),
                        Err(error) => Ok(Check::NotYet(error.to_string())),
                    }
                }
            })
            .await?;
        Ok(BrowserSession { client, driver })
    }

    /// Ends the session (chromedriver stops its Chromium), then the driver.
    async fn close(self) -> Result<()> {
        let BrowserSession { client, driver } = self;
        client.close().await.context("closing the browser session")?;
        drop(driver);
        Ok(())
    }
}
