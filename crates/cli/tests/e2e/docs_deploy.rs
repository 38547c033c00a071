//! Goal: the deployment artefacts in `deploy/` are ones a real host
//! accepts: the systemd unit passes `systemd-analyze verify` without a
//! single complaint and keeps its hardening, the Kubernetes manifests parse
//! as YAML with the expected kinds, probes on the node's real HTTP paths
//! and port, and both start `leasehold serve` with flags it accepts.
//!
//! Method: the unit is copied into a temporary directory with its
//! `ExecStart` binary pointed at the binary under test (verify insists that
//! it exists), and verified there; the manifests are read with a YAML
//! parser; flags are compared with what `leasehold serve --help` lists.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail, ensure};
use yaml_rust2::{Yaml, YamlLoader};

use super::docs_api::repo_root;
use super::support::binary;

/// Where the unit expects the binary.
const INSTALLED_BINARY: &str = "/usr/local/bin/leasehold";
/// The HTTP port the node's probes and manifests use.
const HTTP_PORT: i64 = 7080;

/// Every long flag `leasehold ARGS --help` lists.
pub fn flags_of(args: &[&str]) -> Result<BTreeSet<String>> {
    let output = Command::new(binary())
        .args(args)
        .arg("--help")
        .output()
        .with_context(|| format!("leasehold {} --help", args.join(" ")))?;
    ensure!(output.status.success(), "leasehold {} --help: {}", args.join(" "), output.status);
    let help = String::from_utf8(output.stdout).context("help is not UTF-8")?;
    Ok(long_flags(&help))
}

/// The `--flag` words in `text`, without any `=value`.
fn long_flags(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || c == '"' || c == '\'' || c == ',' || c == '[')
        .filter(|word| word.starts_with("--") && word.len() > 2)
        .map(|word| {
            let word = word.split('=').next().unwrap_or(word);
            word.trim_end_matches(|c: char| !c.is_ascii_alphanumeric()).to_string()
        })
        .collect()
}

/// The unit file's `ExecStart`, its continuation lines joined.
fn exec_start(unit: &str) -> Result<String> {
    let joined = unit.replace("\\\n", " ");
    joined
        .lines()
        .find_map(|line| line.strip_prefix("ExecStart="))
        .map(str::to_string)
        .context("the unit has no ExecStart")
}

#[test]
fn systemd_unit_verifies_and_starts_serve_with_real_flags() -> Result<()> {
    let path = repo_root().join("deploy/leasehold.service");
    let unit = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    for setting in [
        "User=leasehold",
        "StateDirectory=leasehold",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ReadWritePaths=/var/lib/leasehold",
        "Restart=on-failure",
        "LimitNOFILE=",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "KillSignal=SIGTERM",
    ] {
        ensure!(unit.lines().any(|l| l.starts_with(setting)), "the unit lacks {setting}");
    }
    let start = exec_start(&unit)?;
    let serve = format!("{INSTALLED_BINARY} serve ");
    ensure!(start.starts_with(&serve), "ExecStart does not run `{serve}`: {start}");
    let known = flags_of(&["serve"])?;
    let unknown: Vec<String> = long_flags(&start).difference(&known).cloned().collect();
    ensure!(unknown.is_empty(), "ExecStart passes flags serve does not take: {unknown:?}");

    let dir = tempfile::tempdir().context("a temporary directory")?;
    let copy = dir.path().join("leasehold.service");
    std::fs::write(&copy, unit.replace(INSTALLED_BINARY, binary())).context("copying the unit")?;
    let verified = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .context("running systemd-analyze verify")?;
    let complaints = String::from_utf8_lossy(&verified.stderr);
    let complaints = complaints.trim();
    // verify exits 0 on an unknown key or a bad value (it only warns),
    // so a clean unit is one it says nothing about.
    ensure!(
        verified.status.success() && complaints.is_empty(),
        "systemd-analyze verify {} exited {}: {complaints}",
        path.display(),
        verified.status
    );
    Ok(())
}

/// Every YAML document of every manifest in `deploy/kubernetes`.
fn manifests() -> Result<Vec<Yaml>> {
    let dir = repo_root().join("deploy/kubernetes");
    let mut documents = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}", dir.display()))?
        .map(|entry| Ok(entry?.path()))
        .collect::<Result<_>>()?;
    entries.sort();
    for path in entries.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
        let parsed = YamlLoader::load_from_str(&text)
            .with_context(|| format!("{} is not valid YAML", path.display()))?;
        documents.extend(parsed.into_iter().filter(|d| !d.is_null()));
    }
    Ok(documents)
}

/// The node at `path` (keys, or list indexes as numbers) under `yaml`.
fn at<'a>(yaml: &'a Yaml, path: &[&str]) -> Result<&'a Yaml> {
    let mut node = yaml;
    for key in path {
        node = match key.parse::<usize>() {
            Ok(index) => &node[index],
            Err(_) => &node[*key],
        };
        if node.is_badvalue() {
            bail!("no {} in {:?}", path.join("."), kind_of(yaml));
        }
    }
    Ok(node)
}

fn kind_of(yaml: &Yaml) -> &str {
    yaml["kind"].as_str().unwrap_or("a document without a kind")
}

fn text_at<'a>(yaml: &'a Yaml, path: &[&str]) -> Result<&'a str> {
    at(yaml, path)?.as_str().with_context(|| format!("{} is not text", path.join(".")))
}

#[test]
fn kubernetes_manifests_have_the_kinds_probes_and_flags() -> Result<()> {
    let documents = manifests()?;
    let kinds: BTreeSet<&str> = documents.iter().map(kind_of).collect();
    let expected = BTreeSet::from(["PodDisruptionBudget", "Service", "StatefulSet"]);
    ensure!(kinds == expected, "kinds {kinds:?}, expected {expected:?}");
    let of_kind = |kind: &'static str| documents.iter().filter(move |d| kind_of(d) == kind);

    let services: Vec<&Yaml> = of_kind("Service").collect();
    ensure!(
        services.len() == 2,
        "{} Services, expected a headless one and a client one",
        services.len()
    );
    let headless: Vec<&str> = services
        .iter()
        .filter(|s| s["spec"]["clusterIP"].as_str() == Some("None"))
        .map(|s| s["metadata"]["name"].as_str().unwrap_or_default())
        .collect();
    ensure!(headless.len() == 1, "headless Services: {headless:?}");

    let budget = of_kind("PodDisruptionBudget").next().context("no PodDisruptionBudget")?;
    ensure!(at(budget, &["spec", "maxUnavailable"])?.as_i64() == Some(1), "maxUnavailable != 1");

    let set = of_kind("StatefulSet").next().context("no StatefulSet")?;
    ensure!(at(set, &["spec", "replicas"])?.as_i64() == Some(3), "replicas != 3");
    ensure!(
        text_at(set, &["spec", "serviceName"])? == headless[0],
        "the StatefulSet's serviceName is not the headless Service"
    );
    let pod = at(set, &["spec", "template", "spec"])?;
    // Orphans of executor commands are reaped by the pod's pause process,
    // not left as zombies of a node running as process 1.
    ensure!(
        at(pod, &["shareProcessNamespace"])?.as_bool() == Some(true),
        "the pod does not share its process namespace"
    );
    let container = at(pod, &["containers", "0"])?;
    let ports = at(container, &["ports"])?.as_vec().context("ports is not a list")?;
    let http = ports
        .iter()
        .find(|p| p["containerPort"].as_i64() == Some(HTTP_PORT))
        .with_context(|| format!("no container port {HTTP_PORT}"))?;
    let http_name = text_at(http, &["name"])?;
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/livez")] {
        let get = at(container, &[probe, "httpGet"])?;
        ensure!(text_at(get, &["path"])? == path, "{probe} does not GET {path}");
        let port = &get["port"];
        ensure!(
            port.as_str() == Some(http_name) || port.as_i64() == Some(HTTP_PORT),
            "{probe} is not on the HTTP port: {port:?}"
        );
        // Kubernetes' default of 1 s would fail a probe the node answers
        // within its own bound (the store probe's 2 s).
        let timeout = at(container, &[probe, "timeoutSeconds"])?.as_i64();
        let bound = leasehold_replica::readiness::PROBE_TIMEOUT.as_secs();
        ensure!(
            timeout.is_some_and(|t| u64::try_from(t).is_ok_and(|t| t > bound)),
            "{probe} times out after {timeout:?} s, within the node's {bound} s store probe"
        );
    }

    let args = at(container, &["args"])?.as_vec().context("args is not a list")?;
    let script: Vec<&str> = args.iter().filter_map(Yaml::as_str).collect();
    let script = script.join(" ");
    ensure!(script.contains("leasehold serve"), "the container does not run leasehold serve");
    ensure!(script.contains("--http 0.0.0.0:7080"), "serve's --http is not port {HTTP_PORT}");
    let known = flags_of(&["serve"])?;
    let passed = long_flags(&script);
    ensure!(passed.len() >= 8, "only {passed:?} passed to serve");
    let unknown: Vec<&String> = passed.difference(&known).collect();
    ensure!(unknown.is_empty(), "the container passes flags serve does not take: {unknown:?}");

    // TLS comes from a Secret volume mounted where --tls-* point.
    let volumes = at(pod, &["volumes"])?.as_vec().context("volumes is not a list")?;
    let tls = volumes
        .iter()
        .find(|v| !v["secret"]["secretName"].is_badvalue() && v["name"].as_str() == Some("tls"))
        .context("no tls volume from a Secret")?;
    let mounts = at(container, &["volumeMounts"])?.as_vec().context("no volumeMounts")?;
    let mount = mounts
        .iter()
        .find(|m| m["name"] == tls["name"])
        .context("the tls volume is not mounted")?;
    let dir = text_at(mount, &["mountPath"])?;
    ensure!(script.contains(&format!("--tls-ca {dir}/")), "--tls-ca is not under {dir}");
    ensure!(Path::new(dir).is_absolute(), "mount path {dir}");
    Ok(())
}
