//! One test's sandbox: a temporary directory, and the logs written there,
//! kept and printed when the test fails.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use tokio::time::Instant;

/// Lines of each log printed when a test fails.
const LOG_TAIL_LINES: usize = 40;

/// One test's sandbox: its temporary directory and the logs written there.
/// When the test fails (an `Err` from [`Sandbox::run`], a timeout, or a
/// panic) the directory is kept and every log's path and tail are printed.
pub struct Sandbox {
    name: String,
    dir: Option<tempfile::TempDir>,
    path: PathBuf,
    logs: Mutex<Vec<PathBuf>>,
    files: AtomicU32,
    failed: AtomicBool,
}

impl Sandbox {
    /// A fresh sandbox for the test `name` (its directory is named
    /// `leasehold-e2e-NAME-…` in the system's temporary directory).
    pub fn new(name: &str) -> Result<Sandbox> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("leasehold-e2e-{name}-"))
            .tempdir()
            .context("creating the test directory")?;
        let path = dir.path().to_path_buf();
        eprintln!("test {name}: directory {}", path.display());
        Ok(Sandbox {
            name: name.to_string(),
            dir: Some(dir),
            path,
            logs: Mutex::new(Vec::new()),
            files: AtomicU32::new(0),
            failed: AtomicBool::new(false),
        })
    }

    /// The sandbox directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A new file path in the sandbox, numbered so repeated invocations never
    /// overwrite each other's logs, and remembered for the failure report.
    pub fn log_file(&self, label: &str) -> PathBuf {
        let number = self.files.fetch_add(1, Ordering::SeqCst);
        let path = self.path.join(format!("{number:03}-{label}.log"));
        if let Ok(mut logs) = self.logs.lock() {
            logs.push(path.clone());
        }
        path
    }

    /// Runs the story `body` with a time budget; on failure prints the logs
    /// and keeps the directory.
    pub async fn run(
        &self,
        budget: Duration,
        body: impl Future<Output = Result<()>>,
    ) -> Result<()> {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(budget, body).await {
            Ok(outcome) => outcome,
            Err(_) => Err(anyhow!("test exceeded its budget of {} s", budget.as_secs())),
        };
        match &outcome {
            Ok(()) => {
                eprintln!("test {}: passed in {:.1} s", self.name, started.elapsed().as_secs_f64())
            }
            Err(error) => {
                eprintln!("test {}: FAILED: {error:#}", self.name);
                self.failed.store(true, Ordering::SeqCst);
            }
        }
        outcome
    }

    fn report_logs(&self) {
        eprintln!("test {}: kept directory {}", self.name, self.path.display());
        let logs = self.logs.lock().map(|logs| logs.clone()).unwrap_or_default();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(LOG_TAIL_LINES)..];
            eprintln!("===== {} (last {} lines) =====", log.display(), tail.len());
            for line in tail {
                eprintln!("{line}");
            }
        }
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        if self.failed.load(Ordering::SeqCst) || std::thread::panicking() {
            self.report_logs();
            if let Some(dir) = self.dir.take() {
                let _ = dir.keep();
            }
        }
    }
}
