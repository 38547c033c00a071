//! Goal: no stale commands in README.md and docs/operations.md. Every
//! `leasehold` command they show (in code blocks, indented blocks and
//! inline code) parses with the real binary, subcommand, flags and values
//! alike, and every other command is named in [`EXERCISED`] with the test
//! or CI script that runs it. The README tour's client commands also run
//! against a real node.
//!
//! Method: pull the commands out of the Markdown, split them as a shell
//! would (quotes, `#` comments, `\` continuations, leading `VAR=value`),
//! put example values in for the docs' placeholders (`ID`, `N`,
//! `on|off`), and run each `leasehold` command with `--help` added: clap
//! refuses an unknown subcommand, flag or value before it prints help.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};

use super::docs_api::repo_root;
use super::support::{Check, Node, Sandbox, binary, deadline_in, phase, run_cli, wait_until};

/// The documents whose commands are checked.
const DOCUMENTS: [&str; 2] = ["README.md", "docs/operations.md"];
/// Documents whose `leasehold` commands are parse-checked too; their other
/// commands (systemctl, kubectl) are for hosts this test does not have.
const LEASEHOLD_ONLY: [&str; 1] = ["docs/deployment.md"];

/// Commands the docs show that are not `leasehold` itself, by their first
/// words, and where they run.
const EXERCISED: &[(&str, &str)] = &[
    (
        "cargo run --release -- serve",
        "here: `serve` parses, and Cargo.toml's default-members is the CLI",
    ),
    ("cargo build --release", "scripts/check.sh builds the workspace (CI: .ci/run)"),
    ("scripts/check.sh", ".ci/run, which CI runs"),
    (
        "LEASEHOLD_FUZZ_SECONDS=20 scripts/check.sh",
        ".ci/run runs scripts/check.sh; the variable is read there",
    ),
    ("scripts/fuzz.sh", "here: bash -n; the corpus replay runs in scripts/check.sh"),
    (
        "scripts/dev-cluster.sh",
        "here: bash -n, and its leasehold flags are the ones the e2e harness passes",
    ),
    (
        "curl -s 127.0.0.1:7080/readyz",
        "e2e lifecycle::grpc_health_agrees_with_readyz_at_once_and_reflection_lists_what_is_served GETs /readyz",
    ),
    ("grep intended_claim node.log", "e2e gate stories read intended_claim from a node's log"),
    ("alias leasehold=target/release/leasehold", "a shell alias: nothing to run"),
    (
        "export LEASEHOLD_ADDR=",
        "a shell variable: the e2e harness sets LEASEHOLD_ADDR the same way",
    ),
    ("--secure", "an option of scripts/dev-cluster.sh, shown inline"),
];

/// Example values for the docs' placeholders.
fn example_value(word: &str) -> &str {
    match word {
        "ID" | "N" => "2",
        "on|off" => "on",
        "HOST:PORT" | "ANY_MEMBER" => "127.0.0.1:7070",
        "DIR" => "/tmp/leasehold-data",
        other => other,
    }
}

/// One command shown in a document.
#[derive(Debug)]
struct Shown {
    document: &'static str,
    words: Vec<String>,
}

/// Splits one shell line into words: single and double quotes, a `#` that
/// starts a word begins a comment.
fn shell_words(line: &str) -> Result<Vec<String>> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    ensure!(quote.is_none(), "an unclosed quote in {line:?}");
    words.extend(word);
    Ok(words)
}

/// Every command of `text`: the lines of shell code blocks (fenced or
/// indented), and inline code that starts with `leasehold ` or is a known
/// command.
fn commands_in(document: &'static str, text: &str) -> Result<Vec<Shown>> {
    let mut lines: Vec<String> = Vec::new();
    let mut prose = String::new();
    // Inside a fenced block: whether it is shell (```sh, or no language).
    let mut fenced: Option<bool> = None;
    let mut pending = String::new();
    for line in text.lines() {
        if let Some(language) = line.trim_start().strip_prefix("```") {
            fenced = match fenced {
                Some(_) => None,
                None => Some(matches!(language.trim(), "" | "sh" | "bash" | "shell" | "console")),
            };
            continue;
        }
        let code = if let Some(shell) = fenced {
            if !shell {
                continue;
            }
            Some(line)
        } else {
            line.strip_prefix("    ").filter(|l| l.trim_start().starts_with("leasehold "))
        };
        let Some(code) = code else {
            prose.push_str(line);
            prose.push(' ');
            continue;
        };
        match code.trim_end().strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(code);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    // Inline code: every other backtick-delimited span of the prose.
    for (n, span) in prose.split('`').enumerate() {
        let span = span.split_whitespace().collect::<Vec<_>>().join(" ");
        let known = EXERCISED.iter().any(|(shown, _)| span.starts_with(shown));
        if n % 2 == 1 && (span.starts_with("leasehold ") || known) {
            lines.push(span);
        }
    }
    let mut shown = Vec::new();
    for line in lines {
        let words = shell_words(&line).with_context(|| format!("{document}: {line:?}"))?;
        if !words.is_empty() {
            shown.push(Shown { document, words });
        }
    }
    Ok(shown)
}

/// The `leasehold` arguments of a command, or `None` for another program.
fn leasehold_args(words: &[String]) -> Option<Vec<String>> {
    let words: Vec<&String> = words.iter().skip_while(|w| is_assignment(w)).collect();
    let (program, rest) = words.split_first()?;
    let rest: Vec<String> = rest.iter().map(|w| (*w).clone()).collect();
    match program.as_str() {
        "leasehold" | "target/release/leasehold" => Some(rest),
        "cargo" if rest.starts_with(&["run".into(), "--release".into(), "--".into()]) => {
            Some(rest[3..].to_vec())
        }
        _ => None,
    }
}

fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| {
        !name.is_empty() && name.chars().all(|c| c.is_ascii_uppercase() || c == '_')
    })
}

/// Runs `leasehold ARGS --help` (before a `--`, whose words belong to the
/// command a worker runs) and says why it does not parse, if it does not.
fn parse_check(args: &[String]) -> Result<()> {
    let mut argv: Vec<&str> = args.iter().map(|a| example_value(a)).collect();
    let at = argv.iter().position(|a| *a == "--").unwrap_or(argv.len());
    argv.insert(at, "--help");
    let output = Command::new(binary()).args(&argv).output().context("running leasehold")?;
    if !output.status.success() {
        bail!("exit {}: {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}

fn shown_commands() -> Result<Vec<Shown>> {
    let mut all = Vec::new();
    for document in DOCUMENTS.into_iter().chain(LEASEHOLD_ONLY) {
        let path = repo_root().join(document);
        let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
        all.extend(commands_in(document, &text)?);
    }
    Ok(all)
}

#[test]
fn every_command_in_the_docs_parses_or_is_exercised() -> Result<()> {
    let shown = shown_commands()?;
    let leasehold = shown.iter().filter(|s| leasehold_args(&s.words).is_some()).count();
    ensure!(leasehold >= 25, "only {leasehold} leasehold commands found: the extraction is broken");
    let mut problems = Vec::new();
    for command in &shown {
        let line = command.words.join(" ");
        eprintln!("{}: {line}", command.document);
        if let Some(args) = leasehold_args(&command.words) {
            if let Err(why) = parse_check(&args) {
                problems.push(format!("{}: `{line}` does not parse: {why:#}", command.document));
            }
        } else if !LEASEHOLD_ONLY.contains(&command.document)
            && !EXERCISED.iter().any(|(prefix, _)| line.starts_with(prefix))
        {
            problems.push(format!("{}: `{line}` is run by no test or CI script", command.document));
        }
    }
    ensure!(problems.is_empty(), "stale docs:\n  {}", problems.join("\n  "));
    Ok(())
}

#[test]
fn the_docs_scripts_and_workspace_are_as_exercised_says() -> Result<()> {
    let root = repo_root();
    for script in ["scripts/check.sh", "scripts/fuzz.sh", "scripts/dev-cluster.sh"] {
        let status = Command::new("bash").arg("-n").arg(root.join(script)).status()?;
        ensure!(status.success(), "bash -n {script}: {status}");
    }
    let ci = std::fs::read_to_string(root.join(".ci/run")).context(".ci/run")?;
    ensure!(ci.contains("scripts/check.sh"), ".ci/run does not run scripts/check.sh");
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).context("Cargo.toml")?;
    ensure!(
        manifest.contains("default-members = [\"crates/cli\"]"),
        "`cargo run --release -- serve` needs the CLI as the default member"
    );
    Ok(())
}

/// The README tour's client commands, in order, run against a real node:
/// each must succeed, except the ack with a superseded token, which must
/// fail saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_tour_runs_against_a_real_node() -> Result<()> {
    let sandbox = Sandbox::new("docs-tour")?;
    sandbox.run(Duration::from_secs(120), tour(&sandbox)).await
}

async fn tour(sandbox: &Sandbox) -> Result<()> {
    phase("start a node");
    let node = Node::start(sandbox).await?;
    let addr = node.addr();
    let env = [("LEASEHOLD_ADDR", addr.as_str())];
    let path = repo_root().join("README.md");
    let readme = std::fs::read_to_string(&path).context("README.md")?;
    let tour = readme.split("## A five-minute tour").nth(1).context("no tour in README.md")?;
    let tour = tour.split("\n## ").next().unwrap_or(tour);
    let runnable: Vec<Vec<String>> = commands_in("README.md", tour)?
        .into_iter()
        .filter_map(|shown| leasehold_args(&shown.words))
        // A worker and a three-node cluster are stories of their own
        // (command_worker, cluster); `job get 7` names an id of the
        // reader's own run.
        .filter(|args| !matches!(args.first().map(String::as_str), Some("worker" | "cluster")))
        .filter(|args| !args.starts_with(&["job".into(), "get".into()]))
        .collect();
    ensure!(runnable.len() >= 12, "only {} tour commands: {runnable:?}", runnable.len());
    // The tour's schedule appends to a file in /tmp; here, in the sandbox.
    let heartbeat = sandbox.path().join("heartbeat.log");
    let heartbeat = heartbeat.to_str().context("a UTF-8 sandbox path")?;
    let mut refused_stale = false;
    for args in &runnable {
        let args: Vec<String> =
            args.iter().map(|a| a.replace("/tmp/heartbeat.log", heartbeat)).collect();
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = run_cli(sandbox, &argv, &env).await?;
        if argv.windows(2).any(|pair| pair == ["--fencing-token", "7"]) {
            ensure!(!run.status.success(), "the ack with token 7 succeeded");
            ensure!(run.stderr.contains("stale fencing token 7"), "{:?}", run.stderr);
            refused_stale = true;
        } else {
            run.success().with_context(|| format!("leasehold {}", argv.join(" ")))?;
        }
    }
    ensure!(refused_stale, "the tour's stale ack was not run");

    phase("the triggered tick ran its command, and `job get` shows its job acked");
    let listed = wait_until(
        "the tick's command job to be acked",
        deadline_in(Duration::from_secs(30)),
        || async {
            let run = run_cli(
                sandbox,
                &["job", "list", "--queue", "exec", "--state", "acked", "--output", "json"],
                &env,
            )
            .await?
            .success()?;
            let json = run.json()?;
            Ok(match json.pointer("/jobs/0/id").and_then(serde_json::Value::as_u64) {
                Some(id) => Check::Done(id),
                None => Check::NotYet(run.stdout),
            })
        },
    )
    .await?;
    let got = run_cli(sandbox, &["job", "get", &listed.to_string(), "--output", "json"], &env)
        .await?
        .success()?
        .json()?;
    ensure!(got.pointer("/state").and_then(serde_json::Value::as_str) == Some("acked"), "{got}");
    let log = std::fs::read_to_string(heartbeat).context("the tick's command wrote nothing")?;
    ensure!(log.starts_with("tick "), "the tick's command wrote {log:?}");
    Ok(())
}
