//! Writes the committed corpus seeds (see `leasehold_fuzz::seeds`) into
//! `corpus/TARGET/`, replacing the generated ones and leaving every other
//! file (regression inputs, inputs kept from fuzzing runs) alone.
//!
//! Usage, from `fuzz/`: `cargo run --bin seeds [CORPUS_DIR]`.

use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let root = std::env::args().nth(1).map_or_else(|| PathBuf::from("corpus"), PathBuf::from);
    let seeds = leasehold_fuzz::seeds::all();
    for seed in &seeds {
        let directory = root.join(seed.target);
        std::fs::create_dir_all(&directory)?;
        std::fs::write(directory.join(&seed.name), &seed.bytes)?;
    }
    println!("wrote {} seeds under {}", seeds.len(), root.display());
    Ok(())
}
