//! Goal: docs/operations.md's Events table names every event the code
//! logs, and only those: a new `event = "…"` in a tracing call without a
//! row fails here, and so does a row for an event nothing logs.
//!
//! Method: scan every Rust source under `crates/` for `event = "NAME"`
//! and compare with the first column of the table under "## Events".

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, ensure};

use super::docs_api::repo_root;

/// This file, whose comments and patterns name no event.
const THIS_FILE: &str = "tests/e2e/docs_events.rs";

/// Every `event = "NAME"` in the `.rs` files under `dir`.
fn logged_events(dir: &Path, found: &mut BTreeSet<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir).with_context(|| format!("{}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            logged_events(&path, found)?;
        } else if path.extension().is_some_and(|e| e == "rs") && !path.ends_with(THIS_FILE) {
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
            for (at, _) in text.match_indices("event = \"") {
                let rest = &text[at + "event = \"".len()..];
                if let Some((name, _)) = rest.split_once('"') {
                    found.insert(name.to_string());
                }
            }
        }
    }
    Ok(())
}

/// The event names in the first column of the Events table.
fn documented_events() -> Result<BTreeSet<String>> {
    let path = repo_root().join("docs/operations.md");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let section = text.split("\n## Events\n").nth(1).context("operations.md has no ## Events")?;
    let section = section.split("\n## ").next().unwrap_or(section);
    Ok(section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect())
}

#[test]
fn every_logged_event_is_in_the_events_table() -> Result<()> {
    let mut logged = BTreeSet::new();
    logged_events(&repo_root().join("crates"), &mut logged)?;
    ensure!(logged.len() >= 15, "only {logged:?} found: the scan is broken");
    let documented = documented_events()?;
    let missing: Vec<&String> = logged.difference(&documented).collect();
    let stale: Vec<&String> = documented.difference(&logged).collect();
    ensure!(
        missing.is_empty() && stale.is_empty(),
        "docs/operations.md's Events table lacks {missing:?} and lists {stale:?}, which no code logs"
    );
    Ok(())
}
