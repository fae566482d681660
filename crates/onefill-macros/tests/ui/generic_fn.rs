onefill::default_backend!(onefill::MemoryBackend::new());

#[onefill::cached]
fn load<T: std::fmt::Display>(id: T) -> anyhow::Result<String> {
    Ok(format!("item {id}"))
}

fn main() {}
