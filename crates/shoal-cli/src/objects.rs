//! `shoal put` and `shoal get`: one object between a file and the store,
//! with a progress bar for large ones. The file is read straight into the
//! created object's shared memory and written out straight from it: no
//! buffer in between.

use std::fs::File;
use std::io::{Read, Write};
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use shoal_client::Client;
use shoal_core::durability::Durability;
use shoal_core::ObjectId;

use crate::args::SocketArg;

/// Bytes copied per step (and per progress update).
const STEP: usize = 8 << 20;

#[derive(clap::Args, Debug)]
pub struct PutArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// The file whose bytes become the object's data.
    file: PathBuf,
    /// The object's id (40 hex digits) [default: a fresh random id].
    #[arg(long)]
    id: Option<String>,
    /// Also bind this name to it (the POSIX view's path, e.g. data/a.parquet).
    #[arg(long)]
    name: Option<String>,
    /// Acknowledge once this durable: memory, local or backing [default: the node's].
    #[arg(long)]
    durability: Option<Durability>,
    /// How long to wait for room in the store, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u32,
}

#[derive(clap::Args, Debug)]
pub struct GetArgs {
    #[command(flatten)]
    socket: SocketArg,
    /// The object's id (40 hex digits), or with --name its name.
    object: String,
    /// OBJECT is a name, not an id.
    #[arg(long)]
    name: bool,
    /// Write the data here [default: standard output].
    #[arg(long, short = 'o')]
    output: Option<PathBuf>,
    /// How long to wait for the object to appear, in milliseconds.
    #[arg(long, default_value_t = 0)]
    timeout_ms: i64,
}

fn parse_id(hex: &str) -> Result<ObjectId> {
    ObjectId::from_hex(hex).with_context(|| format!("{hex:?} is not an object id (40 hex digits)"))
}

pub fn put(args: PutArgs) -> Result<()> {
    let id = args
        .id
        .as_deref()
        .map(parse_id)
        .transpose()?
        .unwrap_or_else(ObjectId::random);
    if let Some(name) = &args.name {
        shoal_core::names::check(name)?;
    }
    let mut file =
        File::open(&args.file).with_context(|| format!("open {}", args.file.display()))?;
    let size = file.metadata()?.len();
    let mut client = Client::connect(args.socket.path())?;
    let location = client.create(id, size, 0, args.timeout_ms)?;
    let filled = (|| -> Result<()> {
        let dst = client.located_ptr_mut(shoal_core::protocol::Located::local(
            client.node(),
            location,
        ))?;
        // SAFETY: the created object's `size` bytes at `dst` are inside our
        // mapping (checked on receipt) and ours alone until sealed.
        let object = unsafe { std::slice::from_raw_parts_mut(dst, size as usize) };
        let progress = crate::progress::bytes(size, "put");
        for chunk in object.chunks_mut(STEP) {
            file.read_exact(chunk)
                .with_context(|| format!("read {} (did it shrink?)", args.file.display()))?;
            progress.inc(chunk.len() as u64);
        }
        progress.finish_and_clear();
        if let Some(name) = &args.name {
            client.name(id, name)?;
        }
        Ok(())
    })();
    if let Err(err) = filled {
        let _ = client.abort(id);
        return Err(err);
    }
    client.seal_durable(&[id], true, args.durability)?;
    println!("{}", id.to_hex());
    Ok(())
}

pub fn get(args: GetArgs) -> Result<()> {
    let mut client = Client::connect(args.socket.path())?;
    let (id, located) = if args.name {
        let (entry, located) = client.get_named(&args.object, args.timeout_ms)?;
        (entry.id, located)
    } else {
        let id = parse_id(&args.object)?;
        match client.get(&[id], args.timeout_ms)?[0] {
            Some(located) => (id, located),
            None => bail!("object {} not found", id.to_hex()),
        }
    };
    let size = located.location.data_size;
    let src = client.located_ptr(located)?;
    // SAFETY: we hold a reference to the object until the release below, so
    // its sealed bytes stay mapped and unchanged.
    let data = unsafe { std::slice::from_raw_parts(src, size as usize) };
    let mut out: Box<dyn Write> = match &args.output {
        Some(path) => {
            Box::new(File::create(path).with_context(|| format!("create {}", path.display()))?)
        }
        None => Box::new(std::io::stdout().lock()),
    };
    let progress = crate::progress::bytes(size, "get");
    for chunk in data.chunks(STEP) {
        out.write_all(chunk)?;
        progress.inc(chunk.len() as u64);
    }
    out.flush()?;
    progress.finish_and_clear();
    drop(out);
    client.release(&[id])?;
    Ok(())
}
