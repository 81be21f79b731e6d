//! `seed DIR`: writes the readers' seed corpus (dspark_model::fuzzing::seeds, from the
//! repository's fixtures) into DIR, one file per seed.
use std::path::PathBuf;

fn main() -> std::io::Result<()> {
    let out = PathBuf::from(std::env::args().nth(1).unwrap_or_else(|| "corpus/readers".into()));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let scratch = std::env::temp_dir().join(format!("dspark-fuzz-seed-{}", std::process::id()));
    std::fs::create_dir_all(&out)?;
    std::fs::create_dir_all(&scratch)?;
    let seeds = dspark_model::fuzzing::seeds(&root.join("fixtures"), &scratch)?;
    for (i, s) in seeds.iter().enumerate() {
        std::fs::write(out.join(format!("seed-{i:02}")), s)?;
    }
    std::fs::remove_dir_all(&scratch)?;
    println!("{} seeds in {}", seeds.len(), out.display());
    Ok(())
}
