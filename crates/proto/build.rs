//! Compiles `proto/leasehold/v1/*.proto` with protox (pure Rust, so no system
//! protoc is needed) and writes the descriptor set for gRPC reflection.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?).join("../../proto");
    // Every .proto of the package, in a stable order, so a new file cannot be
    // forgotten here.
    let mut files = Vec::new();
    for entry in std::fs::read_dir(root.join("leasehold/v1"))? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.ends_with(".proto") {
            files.push(format!("leasehold/v1/{name}"));
        }
    }
    files.sort();
    println!("cargo:rerun-if-changed={}", root.display());
    println!("cargo:rerun-if-changed={}", root.join("leasehold/v1").display());
    println!("cargo:rerun-if-env-changed=PROTOC");
    for file in &files {
        println!("cargo:rerun-if-changed={}", root.join(file).display());
    }
    let fds = protox::compile(files, [&root])?;
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out.join("leasehold_descriptor.bin"), prost::Message::encode_to_vec(&fds))?;
    tonic_prost_build::configure().build_client(true).build_server(true).compile_fds(fds)?;
    Ok(())
}
