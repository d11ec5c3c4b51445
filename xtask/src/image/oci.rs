//! The image as an OCI archive: an OCI image layout (oci-layout,
//! index.json, blobs) in one tar, with Docker's manifest.json beside it, as
//! `docker save` writes since Docker 25, so that `podman load`, `docker
//! load` (old and new) and `skopeo copy oci-archive:` all take it.
//!
//! Everything is deterministic: entries sorted, every time the source date,
//! owners root, gzip without a name or time.
use std::{collections::BTreeMap, io::Write as _, path::Path};

use anyhow::{Context as _, Result};
use flate2::{Compression, GzBuilder};
use oci_spec::image::{
    ANNOTATION_CREATED, ANNOTATION_REF_NAME, ANNOTATION_REVISION, ANNOTATION_SOURCE, ANNOTATION_TITLE,
    ANNOTATION_VERSION, Arch, ConfigBuilder, Descriptor, DescriptorBuilder, HistoryBuilder, ImageConfigurationBuilder,
    ImageIndexBuilder, ImageManifestBuilder, MediaType, OciLayoutBuilder, Os, RootFsBuilder, Sha256Digest,
};
use sha2::{Digest as _, Sha256};

use super::{BINARY, DEFAULT_ARGS, ImageFile, METRICS_PORT, rfc3339};

pub struct Image<'a> {
    pub files: &'a [ImageFile],
    /// Full references, e.g. localhost/observer:0.1.0.
    pub tags: &'a [String],
    pub version: &'a str,
    pub commit: &'a str,
    /// Seconds since the epoch: every file's time, the image's creation.
    pub epoch: u64,
}

pub struct Written {
    /// `sha256:...`: what `podman images --digests` shows.
    pub manifest_digest: String,
    pub layer_size: u64,
    pub unpacked_size: u64,
}

pub fn write(image: &Image, archive: &Path) -> Result<Written> {
    let layer_tar = layer(image.files, image.epoch)?;
    let diff_id = sha256(&layer_tar);
    let mut gz = GzBuilder::new().mtime(0).write(Vec::new(), Compression::best());
    gz.write_all(&layer_tar)?;
    let layer_gz = gz.finish()?;
    let mut blobs: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let layer = descriptor(MediaType::ImageLayerGzip, &layer_gz)?;
    blobs.insert(sha256(&layer_gz), layer_gz.clone());

    let created = rfc3339(image.epoch);
    let mut labels = std::collections::HashMap::new();
    labels.insert(ANNOTATION_TITLE.to_string(), "observer".to_string());
    labels.insert(ANNOTATION_VERSION.to_string(), image.version.to_string());
    labels.insert(ANNOTATION_REVISION.to_string(), image.commit.to_string());
    labels.insert(ANNOTATION_SOURCE.to_string(), env!("CARGO_PKG_REPOSITORY").to_string());
    labels.insert(ANNOTATION_CREATED.to_string(), created.clone());
    let config = ImageConfigurationBuilder::default()
        .created(created.clone())
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(
            ConfigBuilder::default()
                .entrypoint(vec![BINARY.to_string()])
                .cmd(DEFAULT_ARGS.map(String::from).to_vec())
                .env(vec!["PATH=/usr/local/bin".to_string()])
                .exposed_ports(vec![format!("{METRICS_PORT}/tcp")])
                .labels(labels.clone())
                .build()?,
        )
        .rootfs(RootFsBuilder::default().typ("layers").diff_ids(vec![format!("sha256:{diff_id}")]).build()?)
        .history(vec![
            HistoryBuilder::default()
                .created(created.clone())
                .created_by("cargo xtask image: observer, its shared libraries, CA certificates")
                .build()?,
        ])
        .build()?;
    let config_json = json(&config)?;
    let config_desc = descriptor(MediaType::ImageConfig, &config_json)?;
    blobs.insert(sha256(&config_json), config_json);

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(config_desc)
        .layers(vec![layer])
        .annotations(labels)
        .build()?;
    let manifest_json = json(&manifest)?;
    let manifest_sha = sha256(&manifest_json);
    blobs.insert(manifest_sha.clone(), manifest_json.clone());

    // One entry per tag, as docker save writes them: the full reference in
    // containerd's annotation, the tag alone in the OCI one.
    let manifests = image
        .tags
        .iter()
        .map(|tag| {
            let mut d = descriptor(MediaType::ImageManifest, &manifest_json)?;
            let short = tag.rsplit_once(':').map_or(tag.as_str(), |(_, t)| t);
            d.set_annotations(Some(
                [
                    ("io.containerd.image.name".to_string(), tag.clone()),
                    (ANNOTATION_REF_NAME.to_string(), short.to_string()),
                ]
                .into(),
            ));
            Ok(d)
        })
        .collect::<Result<Vec<_>>>()?;
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(manifests)
        .build()?;
    let layout = OciLayoutBuilder::default().image_layout_version("1.0.0").build()?;
    // Docker's own format, for docker load before version 25.
    let docker_manifest = serde_json::json!([{
        "Config": format!("blobs/sha256/{}", sha256(&json(&config)?)),
        "RepoTags": image.tags,
        "Layers": [format!("blobs/sha256/{}", sha256(&layer_gz))],
    }]);

    let mut entries: Vec<(String, Vec<u8>)> = vec![
        ("oci-layout".into(), json(&layout)?),
        ("index.json".into(), json(&index)?),
        ("manifest.json".into(), json(&docker_manifest)?),
    ];
    entries.extend(blobs.into_iter().map(|(sha, bytes)| (format!("blobs/sha256/{sha}"), bytes)));
    let mut out = tar::Builder::new(Vec::new());
    for dir in ["blobs/", "blobs/sha256/"] {
        append(&mut out, dir, &[], 0o755, image.epoch, tar::EntryType::Directory)?;
    }
    for (name, bytes) in &entries {
        append(&mut out, name, bytes, 0o644, image.epoch, tar::EntryType::Regular)?;
    }
    let bytes = out.into_inner()?;
    std::fs::write(archive, bytes).with_context(|| format!("cannot write {}", archive.display()))?;
    Ok(Written {
        manifest_digest: format!("sha256:{manifest_sha}"),
        layer_size: layer_gz.len() as u64,
        unpacked_size: layer_tar.len() as u64,
    })
}

/// The one layer: every file and the directories above them.
fn layer(files: &[ImageFile], epoch: u64) -> Result<Vec<u8>> {
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        let mut p = Path::new(f.path.trim_start_matches('/'));
        while let Some(parent) = p.parent().filter(|p| !p.as_os_str().is_empty()) {
            dirs.insert(format!("{}/", parent.display()));
            p = parent;
        }
    }
    let mut out = tar::Builder::new(Vec::new());
    for dir in &dirs {
        append(&mut out, dir, &[], 0o755, epoch, tar::EntryType::Directory)?;
    }
    for f in files {
        let bytes = std::fs::read(&f.source).with_context(|| format!("cannot read {}", f.source.display()))?;
        append(&mut out, f.path.trim_start_matches('/'), &bytes, f.mode, epoch, tar::EntryType::Regular)?;
    }
    Ok(out.into_inner()?)
}

fn append(
    out: &mut tar::Builder<Vec<u8>>,
    path: &str,
    bytes: &[u8],
    mode: u32,
    epoch: u64,
    kind: tar::EntryType,
) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_size(bytes.len() as u64);
    header.set_mode(mode);
    header.set_mtime(epoch);
    header.set_uid(0);
    header.set_gid(0);
    out.append_data(&mut header, path, bytes)?;
    Ok(())
}

/// JSON with its object keys sorted: oci-spec keeps labels and annotations
/// in HashMaps, whose order changes from one run to the next (and with it
/// every digest); serde_json's own map is ordered.
fn json(value: &impl serde::Serialize) -> Result<Vec<u8>> {
    Ok(serde_json::to_vec(&serde_json::to_value(value)?)?)
}

fn sha256(bytes: &[u8]) -> String {
    format!("{:x}", Sha256::digest(bytes))
}

fn descriptor(media_type: MediaType, bytes: &[u8]) -> Result<Descriptor> {
    let digest: Sha256Digest = sha256(bytes).parse()?;
    Ok(DescriptorBuilder::default().media_type(media_type).size(bytes.len() as u64).digest(digest).build()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_files_give_the_same_archive_byte_for_byte() {
        let dir = std::env::temp_dir().join(format!("observer-oci-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("binary"), b"\x7fELF pretend").unwrap();
        std::fs::write(dir.join("ca.crt"), b"certificates").unwrap();
        let files = [
            ImageFile { path: "/etc/ssl/certs/ca.crt".into(), source: dir.join("ca.crt"), mode: 0o644, made_by: None },
            ImageFile { path: BINARY.into(), source: dir.join("binary"), mode: 0o755, made_by: None },
        ];
        let tags = ["localhost/observer:1.2.3".to_string(), "localhost/observer:abc".to_string()];
        let image = Image { files: &files, tags: &tags, version: "1.2.3", commit: "abc", epoch: 1_700_000_000 };
        let (a, b) = (dir.join("a.tar"), dir.join("b.tar"));
        let first = write(&image, &a).unwrap();
        // Other file times on disk must not matter.
        std::fs::write(dir.join("binary"), b"\x7fELF pretend").unwrap();
        let second = write(&image, &b).unwrap();
        assert_eq!(first.manifest_digest, second.manifest_digest);
        assert_eq!(std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
        // Both tags, for both loaders.
        let mut archive = tar::Archive::new(std::fs::File::open(&a).unwrap());
        let mut docker_manifest = String::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.path().unwrap().to_str() == Some("manifest.json") {
                std::io::Read::read_to_string(&mut entry, &mut docker_manifest).unwrap();
            }
        }
        let manifest: serde_json::Value = serde_json::from_str(&docker_manifest).unwrap();
        assert_eq!(manifest[0]["RepoTags"], serde_json::json!(tags));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
