//! The image's software bill of materials, SPDX 2.3 JSON: the image, the
//! crates compiled into observer (its eBPF programs' included), and the
//! Debian packages the other files come from, each with its version, its
//! license where known and a package URL (purl), so a scanner can match
//! them against advisories.
use std::{collections::BTreeSet, path::Path, process::Command};

use anyhow::{Context as _, Result, ensure};
use serde_json::{Value, json};

use super::{ImageFile, NAME, rfc3339};
use crate::workspace_root;

pub fn write(
    files: &[ImageFile],
    version: &str,
    commit: &str,
    epoch: u64,
    manifest_digest: &str,
    out: &Path,
) -> Result<()> {
    let mut packages = vec![json!({
        "SPDXID": "SPDXRef-Image",
        "name": "observer-image",
        "versionInfo": version,
        "downloadLocation": "NOASSERTION",
        "primaryPackagePurpose": "CONTAINER",
        "externalRefs": [purl(&format!("pkg:oci/observer@{}?repository_url={NAME}", manifest_digest.replace(':', "%3A")))],
    })];
    for Crate { name, version, license, registry } in crates()? {
        let purl_text =
            if registry { format!("pkg:cargo/{name}@{version}") } else { format!("pkg:generic/{name}@{version}") };
        packages.push(json!({
            "SPDXID": format!("SPDXRef-Crate-{}", spdx_id(&format!("{name}-{version}"))),
            "name": name,
            "versionInfo": version,
            "downloadLocation": if registry { format!("https://crates.io/api/v1/crates/{name}/{version}/download") } else { "NOASSERTION".into() },
            "licenseDeclared": license.unwrap_or_else(|| "NOASSERTION".into()),
            "externalRefs": [purl(&purl_text)],
        }));
    }
    for (package, version, arch) in debian_packages(files)? {
        packages.push(json!({
            "SPDXID": format!("SPDXRef-Deb-{}", spdx_id(&package)),
            "name": package,
            "versionInfo": version,
            "supplier": "Organization: Debian",
            "downloadLocation": "NOASSERTION",
            "externalRefs": [purl(&format!("pkg:deb/debian/{package}@{}?arch={arch}", version.replace(':', "%3A")))],
        }));
    }
    let relationships: Vec<Value> = std::iter::once(json!({
        "spdxElementId": "SPDXRef-DOCUMENT", "relationshipType": "DESCRIBES", "relatedSpdxElement": "SPDXRef-Image",
    }))
    .chain(packages.iter().skip(1).map(|p| {
        json!({ "spdxElementId": "SPDXRef-Image", "relationshipType": "CONTAINS", "relatedSpdxElement": p["SPDXID"] })
    }))
    .collect();
    let document = json!({
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": format!("observer-image-{version}"),
        "documentNamespace": format!("{}/spdx/observer-image-{version}-{commit}", env!("CARGO_PKG_REPOSITORY")),
        "creationInfo": { "created": rfc3339(epoch), "creators": ["Tool: cargo xtask image"] },
        "packages": packages,
        "relationships": relationships,
    });
    std::fs::write(out, serde_json::to_vec_pretty(&document)?)
        .with_context(|| format!("cannot write {}", out.display()))
}

fn purl(locator: &str) -> Value {
    json!({ "referenceCategory": "PACKAGE-MANAGER", "referenceType": "purl", "referenceLocator": locator })
}

/// SPDX ids allow letters, digits, `.` and `-`.
fn spdx_id(s: &str) -> String {
    s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '.' || c == '-' { c } else { '-' }).collect()
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Crate {
    name: String,
    version: String,
    license: Option<String>,
    /// From crates.io (else a path crate of this workspace).
    registry: bool,
}

/// Every crate in observer and its eBPF programs: the normal dependencies
/// reachable from both, as `cargo metadata` resolves them for this target.
fn crates() -> Result<Vec<Crate>> {
    let out = Command::new("cargo")
        .current_dir(workspace_root())
        .args(["metadata", "--format-version", "1", "--locked", "--filter-platform", "x86_64-unknown-linux-gnu"])
        .output()
        .context("cannot run cargo metadata")?;
    ensure!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let meta: Value = serde_json::from_slice(&out.stdout)?;
    let id_of = |name: &str| {
        meta["packages"].as_array().into_iter().flatten().find(|p| p["name"] == name).map(|p| p["id"].clone())
    };
    let nodes = meta["resolve"]["nodes"].as_array().context("cargo metadata without a resolve")?;
    let mut todo: Vec<Value> = ["observer", "observer-ebpf"].iter().filter_map(|n| id_of(n)).collect();
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        let Some(id_text) = id.as_str() else { continue };
        if !seen.insert(id_text.to_string()) {
            continue;
        }
        let Some(node) = nodes.iter().find(|n| n["id"] == id) else { continue };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let normal = dep["dep_kinds"].as_array().into_iter().flatten().any(|k| k["kind"].is_null());
            if normal {
                todo.push(dep["pkg"].clone());
            }
        }
    }
    let mut crates: Vec<_> = meta["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["id"].as_str().is_some_and(|id| seen.contains(id)))
        .map(|p| Crate {
            name: p["name"].as_str().unwrap_or_default().to_string(),
            version: p["version"].as_str().unwrap_or_default().to_string(),
            license: p["license"].as_str().map(String::from),
            registry: p["source"].as_str().is_some_and(|s| s.contains("crates.io")),
        })
        .collect();
    crates.sort();
    Ok(crates)
}

/// (package, version, architecture) of the Debian packages that installed
/// the image's files other than observer (`dpkg -S` on each).
fn debian_packages(files: &[ImageFile]) -> Result<BTreeSet<(String, String, String)>> {
    let mut found = BTreeSet::new();
    for f in files.iter().filter(|f| f.path != super::BINARY) {
        let package = match f.made_by {
            Some(package) => package.to_string(),
            None => owner(&f.path)?,
        };
        let query = Command::new("dpkg-query").args(["-W", "-f=${Version} ${Architecture}", &package]).output()?;
        let info = String::from_utf8(query.stdout)?;
        let (version, arch) = info.trim().split_once(' ').context("dpkg-query: no version")?;
        found.insert((package, version.to_string(), arch.to_string()));
    }
    Ok(found)
}

/// The package that installed `path` (`dpkg -S`).
fn owner(path: &str) -> Result<String> {
    let out = Command::new("dpkg").arg("-S").arg(path).output().context("cannot run dpkg")?;
    // Debian's merged /usr: the file may be registered under /usr.
    let out =
        if out.status.success() { out } else { Command::new("dpkg").arg("-S").arg(format!("/usr{path}")).output()? };
    ensure!(out.status.success(), "{path}: no Debian package installed it (dpkg -S)");
    let text = String::from_utf8(out.stdout)?;
    Ok(text.split(':').next().unwrap_or_default().trim().to_string())
}
