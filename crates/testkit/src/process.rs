//! A child process of a test: started with its output in a log file,
//! signalled by its pid, and killed and reaped when dropped.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::time::Instant;

use crate::wait::{Check, wait_until};

/// A started child process, SIGKILLed by its pid and reaped when dropped so
/// no test leaves a process behind, whatever way it ends.
pub struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    exited: Option<ExitStatus>,
}

impl Process {
    /// Starts `command` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut command: Command, log: &Path) -> Result<Process> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("duplicating the log handle")?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command.spawn().with_context(|| format!("starting {name}: {command:?}"))?;
        eprintln!("started {name} (pid {}), log {}", child.id(), log.display());
        Ok(Process { name: name.to_string(), child, log: log.to_path_buf(), exited: None })
    }

    /// Starts `command` with stdout and stderr in files of their own;
    /// stderr is the log a failure names.
    pub fn spawn_split(
        name: &str,
        mut command: Command,
        stdout: &Path,
        stderr: &Path,
    ) -> Result<Process> {
        let out = File::create(stdout).with_context(|| format!("creating {}", stdout.display()))?;
        let err = File::create(stderr).with_context(|| format!("creating {}", stderr.display()))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = command.spawn().with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(Process { name: name.to_string(), child, log: stderr.to_path_buf(), exited: None })
    }

    fn pid(&self) -> Result<Pid> {
        let raw = i32::try_from(self.child.id()).context("pid does not fit a pid_t")?;
        Ok(Pid::from_raw(raw))
    }

    /// Sends `signal` to the process (by its pid).
    pub fn signal(&self, signal: Signal) -> Result<()> {
        if self.exited.is_some() {
            bail!("{} already exited; cannot send {signal}", self.name);
        }
        kill(self.pid()?, signal).with_context(|| format!("sending {signal} to {}", self.name))
    }

    /// The exit status, if the process has exited.
    pub fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        if self.exited.is_none() {
            self.exited =
                self.child.try_wait().with_context(|| format!("polling {}", self.name))?;
        }
        Ok(self.exited)
    }

    /// Waits for the process to exit by itself before `deadline`.
    pub async fn wait_exit(&mut self, deadline: Instant) -> Result<ExitStatus> {
        let what = format!("{} to exit", self.name);
        wait_until(&what, deadline, || {
            let status = self.exit_status();
            async move {
                Ok(match status? {
                    Some(status) => Check::Done(status),
                    None => Check::NotYet("still running".to_string()),
                })
            }
        })
        .await
    }

    /// SIGKILLs the process and reaps it.
    pub fn kill(&mut self) -> Result<()> {
        if self.exit_status()?.is_some() {
            return Ok(());
        }
        self.signal(Signal::SIGKILL)?;
        let status = self.child.wait().with_context(|| format!("reaping {}", self.name))?;
        self.exited = Some(status);
        Ok(())
    }

    /// Fails if the process has exited (it was expected to keep running).
    pub fn ensure_running(&mut self) -> Result<()> {
        match self.exit_status()? {
            None => Ok(()),
            Some(status) => {
                bail!("{} exited unexpectedly ({status}); log {}", self.name, self.log.display())
            }
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Err(error) = self.kill() {
            eprintln!("cleanup of {} (log {}): {error:#}", self.name, self.log.display());
        }
    }
}
