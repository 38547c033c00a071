//! Goal: docs/api.md stays true to the protos: every service, RPC,
//! message, field and enum value in `proto/leasehold/v1/*.proto` is
//! documented, with the RPC's real request and response types and the role
//! the gRPC edge actually demands; and the page names no RPC that does
//! not exist.
//!
//! Method: a small reader of the proto files (they use no syntax beyond
//! services, messages, enums, `optional`/`repeated` fields, `oneof`s and
//! one streaming RPC), the page split at its `### ` headings, and the edge's own
//! `requirement` table for the roles.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail, ensure};
use leasehold_server::auth::{Requirement, requirement};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// One RPC as the protos declare it.
#[derive(Debug)]
struct Rpc {
    service: String,
    name: String,
    request: String,
    response: String,
}

/// What the protos declare: RPCs, and each message's fields (or each
/// enum's values) by type name.
#[derive(Debug, Default)]
struct Protos {
    rpcs: Vec<Rpc>,
    types: BTreeMap<String, Vec<String>>,
}

/// Reads every `.proto` under `proto/leasehold/v1`.
fn read_protos() -> Result<Protos> {
    let dir = repo_root().join("proto/leasehold/v1");
    let mut protos = Protos::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .with_context(|| format!("{}", dir.display()))?
        .map(|entry| Ok(entry?.path()))
        .collect::<Result<_>>()?;
    files.retain(|path| path.extension().is_some_and(|e| e == "proto"));
    files.sort();
    ensure!(files.len() >= 5, "only {} proto files in {}", files.len(), dir.display());
    for file in files {
        let text = std::fs::read_to_string(&file).with_context(|| format!("{}", file.display()))?;
        parse_proto(&text, &mut protos).with_context(|| format!("{}", file.display()))?;
    }
    Ok(protos)
}

fn parse_proto(text: &str, protos: &mut Protos) -> Result<()> {
    // The innermost open block: a service, or a message or enum by name.
    let mut service: Option<String> = None;
    let mut current: Option<(bool, String)> = None;
    for raw in text.lines() {
        let line = raw.split("//").next().unwrap_or_default().trim();
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["service", name, "{"] => service = Some((*name).to_string()),
            ["rpc", ..] => {
                let service = service.clone().context("an rpc outside a service")?;
                let (name, rest) = line["rpc".len()..].split_once('(').context("rpc without (")?;
                let (request, rest) = rest.split_once(')').context("rpc without )")?;
                let (_, response) = rest.split_once('(').context("rpc without a response")?;
                let response = response.split_once(')').context("response without )")?.0;
                // A streaming side (`stream T`) is documented as its type.
                let unstream = |side: &str| side.trim().trim_start_matches("stream ").to_string();
                protos.rpcs.push(Rpc {
                    service,
                    name: name.trim().to_string(),
                    request: unstream(request),
                    response: unstream(response),
                });
            }
            [kind @ ("message" | "enum"), name, "{", rest @ ..] => {
                protos.types.insert((*name).to_string(), Vec::new());
                if rest != ["}"] {
                    current = Some((*kind == "message", (*name).to_string()));
                }
            }
            ["oneof", _, "{"] => {}
            ["}"] if current.is_some() => current = None,
            ["}"] => service = None,
            _ if line.contains('=') && line.ends_with(';') => {
                let Some((message, name)) = &current else { continue };
                let before = line.split('=').next().unwrap_or_default();
                let parts: Vec<&str> = before.split_whitespace().collect();
                let field = if *message { parts.last() } else { parts.first() };
                let field = field.with_context(|| format!("no field name in {line:?}"))?;
                protos.types.entry(name.clone()).or_default().push((*field).to_string());
            }
            _ => {}
        }
    }
    Ok(())
}

/// docs/api.md split at its `## ` and `### ` headings: the heading without
/// its backticks → the text under it.
fn api_sections() -> Result<BTreeMap<String, String>> {
    let path = repo_root().join("docs/api.md");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let mut sections = BTreeMap::new();
    let mut heading: Option<String> = None;
    let mut body = String::new();
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("### ").or_else(|| line.strip_prefix("## ")) {
            if let Some(done) = heading.take() {
                sections.insert(done, std::mem::take(&mut body));
            }
            heading = Some(title.trim().replace('`', ""));
        } else {
            body.push_str(line);
            body.push('\n');
        }
    }
    if let Some(done) = heading {
        sections.insert(done, body);
    }
    Ok(sections)
}

/// The role docs/api.md must name for `rpc`, from the edge's table.
fn documented_role(rpc: &Rpc) -> String {
    match requirement(&format!("/leasehold.v1.{}/{}", rpc.service, rpc.name)) {
        Requirement::Open => "open".to_string(),
        Requirement::Node => "node only".to_string(),
        Requirement::Role(role) => role.to_string(),
    }
}

#[test]
fn api_md_covers_every_rpc_and_field() -> Result<()> {
    let protos = read_protos()?;
    let sections = api_sections()?;
    ensure!(protos.rpcs.len() >= 30, "only {} RPCs read from the protos", protos.rpcs.len());
    let mut missing = Vec::new();
    let services: BTreeSet<&str> = protos.rpcs.iter().map(|rpc| rpc.service.as_str()).collect();
    for service in services {
        if !sections.contains_key(&format!("Service {service}")) {
            missing.push(format!("service {service}"));
        }
    }
    for rpc in &protos.rpcs {
        let title = format!("{}.{}", rpc.service, rpc.name);
        let Some(body) = sections.get(&title) else {
            missing.push(format!("RPC {title}"));
            continue;
        };
        let types = format!("Request: [`{}`]", rpc.request);
        let answer = format!("response: [`{}`]", rpc.response);
        if !body.contains(&types) || !body.contains(&answer) {
            missing.push(format!("{title}: {} -> {}", rpc.request, rpc.response));
        }
        let role = format!("- Role: {}", documented_role(rpc));
        if !body.lines().any(|line| line.starts_with(&role)) {
            missing.push(format!("{title}: \"{role}\""));
        }
        if !body.contains("- Errors: ") {
            missing.push(format!("{title}: its errors"));
        }
    }
    for (name, fields) in &protos.types {
        let Some(body) = sections.get(name) else {
            missing.push(format!("message or enum {name}"));
            continue;
        };
        for field in fields {
            if !body.lines().any(|line| line.starts_with(&format!("| `{field}` |"))) {
                missing.push(format!("{name}.{field}"));
            }
        }
    }
    // The other way round: every RPC heading is one the protos declare.
    for title in sections.keys().filter(|t| t.contains('.') && !t.contains(' ')) {
        if !protos.rpcs.iter().any(|rpc| *title == format!("{}.{}", rpc.service, rpc.name)) {
            missing.push(format!("api.md documents {title}, which no proto declares"));
        }
    }
    if !missing.is_empty() {
        bail!("docs/api.md is out of step with the protos:\n  {}", missing.join("\n  "));
    }
    Ok(())
}
