//! The `shoal` command line. A library so the same code runs as the cargo
//! binary and as the `shoal` script installed by the Python wheel (which
//! calls [`run`] through the extension module).

mod args;
mod bench;
mod cluster;
mod cluster_tls;
mod elastic;
pub mod features;
mod mount;
mod node_process;
use args::{size, SocketArg};
mod objects;
mod progress;
mod tiers;
mod top;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::{Parser, Subcommand};
use shoal_client::Client;
use shoal_core::units::format_size;
use shoal_daemon::{DaemonConfig, Shutdown};

/// shoal: a zero-copy shared-memory object store for Arrow data.
#[derive(Parser, Debug)]
#[command(name = "shoal", version, about, long_about = None)]
struct Cli {
    /// Log lines as text, or as JSON objects (one a line, with the span
    /// fields) for log shippers. Daemons started by `cluster up` inherit it.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "SHOAL_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::ValueEnum, Debug, Clone, Copy, Default, PartialEq, Eq)]
enum LogFormat {
    #[default]
    Text,
    Json,
}

impl LogFormat {
    fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// `PORT` (on loopback: the endpoint is for this host unless said otherwise) or `ADDRESS:PORT`.
fn metrics_address(text: &str) -> Result<std::net::SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok((std::net::Ipv4Addr::LOCALHOST, port).into());
    }
    text.parse()
        .map_err(|e| format!("{text:?} is neither a port nor an address:port ({e})"))
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a store daemon in the foreground.
    Serve {
        #[command(flatten)]
        socket: SocketArg,
        /// Memory the store may use, e.g. 4GiB, 512MiB, 1.5G [default: 1GiB; with
        /// --cluster, the node's region_size].
        #[arg(long, short = 'm', value_parser = size, env = "SHOAL_CAPACITY")]
        capacity: Option<u64>,
        /// mmap-able region path (hugetlbfs file, DAX device). Default: a fresh file in /dev/shm.
        #[arg(long)]
        region: Option<PathBuf>,
        /// Region length if larger than the capacity (room for the capacity to grow).
        #[arg(long, value_parser = size)]
        region_size: Option<u64>,
        /// Object alignment and padding in bytes (64, or 128 for POWER9 fabrics).
        #[arg(long, default_value_t = 64)]
        line_size: u64,
        /// Eviction policy: lru, lfu, lrfu or forecast (the farthest predicted read first: iterative jobs).
        #[arg(long, default_value = "lru")]
        policy: String,
        /// Do not fault the region in at start.
        #[arg(long)]
        no_prefault: bool,
        /// Exit after this many seconds without clients (used by the embedded store).
        #[arg(long)]
        idle_exit: Option<f64>,
        /// Run as one node of the cluster this file describes (socket, region,
        /// size and peer address come from the file).
        #[arg(long, requires = "node")]
        cluster: Option<PathBuf>,
        /// This node's id in the cluster file.
        #[arg(long, requires = "cluster")]
        node: Option<u32>,
        /// Keep which of the file's nodes are members in etcd
        /// (`etcd://host:2379[,host:2379…]/prefix`): nodes join and leave the
        /// running cluster [default: the file's `membership`, else every
        /// node of the file, always].
        #[arg(long, requires = "cluster")]
        membership: Option<shoal_cluster::membership_url::MembershipUrl>,
        /// Also serve clients of this user id (repeatable); by default only
        /// the daemon's own user and root are served. They need access to the
        /// socket too.
        #[arg(long = "allow-uid", value_name = "UID")]
        allow_uids: Vec<u32>,
        /// Serve Prometheus metrics (/metrics) and a read-only status page (/)
        /// over HTTP here: ADDRESS:PORT, or a PORT on 127.0.0.1 [default: with
        /// --cluster, the node's `metrics` in the file; else none].
        #[arg(long, value_name = "ADDRESS", value_parser = metrics_address)]
        metrics_addr: Option<std::net::SocketAddr>,
        #[command(flatten)]
        tiers: Box<tiers::TierArgs>,
        #[command(flatten)]
        elastic: Box<elastic::ElasticArgs>,
    },
    /// Start, stop or inspect a cluster of daemons.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Show capacity, usage, object and client counts.
    Stat {
        #[command(flatten)]
        socket: SocketArg,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print the capacity controller's trace instead (CSV: one row per
        /// control step, the last 30 minutes).
        #[arg(long)]
        trace: bool,
    },
    /// List objects (of one daemon, or with --cluster of every node).
    Ls {
        #[command(flatten)]
        socket: SocketArg,
        /// Print JSON lines.
        #[arg(long)]
        json: bool,
        /// List every node of the cluster in this directory (`cluster up --dir`)
        /// [default directory: cluster/ beside the default socket].
        #[arg(long)]
        cluster: bool,
        /// The cluster's directory (with --cluster).
        #[arg(long, requires = "cluster")]
        dir: Option<PathBuf>,
        /// A cluster file (with --cluster).
        #[arg(long, requires = "cluster", conflicts_with = "dir")]
        file: Option<PathBuf>,
    },
    /// Put a file's bytes into the store as one object; prints its id.
    Put(objects::PutArgs),
    /// Write one object's data to a file or standard output.
    Get(objects::GetArgs),
    /// Mount the store as a file system (FUSE): names are files, name prefixes
    /// directories. Runs in the foreground until stopped, unmounted, or the daemon goes.
    Mount(mount::MountArgs),
    /// Unmount a `shoal mount` (lazily: the mount point is free at once).
    Umount { mountpoint: std::path::PathBuf },
    /// Bring objects into memory from the tiers below (IME's stage-in).
    StageIn(tiers::StageArgs),
    /// Write objects down to the lowest tier and free their memory.
    StageOut(tiers::StageArgs),
    /// A live view of a cluster's nodes (or of daemons' metrics addresses), refreshed every second.
    Top(top::TopArgs),
    /// Run the Table I object micro-benchmark (put, get from another process, read).
    Bench(bench::BenchArgs),
    /// (internal) The reading side of `shoal bench`, run in a second process.
    #[command(hide = true)]
    BenchReader(bench::ReaderArgs),
}

#[derive(Subcommand, Debug)]
enum ClusterCommand {
    /// Emulate a cluster on this host: one daemon per node, /dev/shm regions.
    Up(cluster::UpArgs),
    /// Stop the daemons `cluster up` started and remove their regions.
    Down(cluster::DirArgs),
    /// Nodes, access modes, liveness and memory per node.
    Status(cluster::DirArgs),
    /// Make a node's key pair for a hand-written cluster file: writes the
    /// private key (0600) and prints the `public_key` line for its [[node]].
    Keygen(cluster::KeygenArgs),
    /// Make the cluster's TLS CA (`ca.crt`, `ca.key`): peer traffic between
    /// hosts goes over TLS 1.3 with certificates it signs (`keygen --ca`).
    Ca(cluster_tls::CaArgs),
    /// Issue a node's TLS certificate with the CA, for the public key its
    /// host sent (`keygen --ca` does both on one machine).
    Cert(cluster_tls::CertArgs),
    /// Revoke a node's certificate: adds it to the revocation list every
    /// node reads (`tls_crl`), which they load again within a second.
    Revoke(cluster_tls::RevokeArgs),
    /// Validate a (hand-written) cluster file: every error and warning in
    /// words, naming the node and the key; exit status 1 on an error.
    Check(cluster::CheckArgs),
}

/// Runs the CLI with `args` (argv[0] first). `self_command` is how to start
/// this program again (for `bench`'s reader process). Returns the exit code.
pub fn run(args: Vec<String>, self_command: Vec<String>) -> i32 {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            let _ = err.print();
            return if err.use_stderr() { 2 } else { 0 };
        }
    };
    init_logs(cli.log_format);

    match dispatch(cli.command, self_command, cli.log_format) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("shoal: {err:#}");
            1
        }
    }
}

/// Logs to stderr, filtered by `SHOAL_LOG` (`info` when unset or not a filter): a
/// default level and `target=level` pairs, comma-separated (`debug,h2=info`;
/// docs/operations.md). tracing-subscriber's `Targets` reads exactly that; its
/// `EnvFilter` (span and field matches too) brought a regex engine, 5 % of the
/// extension's compile time.
fn init_logs(format: LogFormat) {
    use tracing_subscriber::fmt;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = log_filter(std::env::var("SHOAL_LOG").ok().as_deref());
    // The filter alone decides: `fmt()`'s own subscriber would drop debug lines.
    let logs = tracing_subscriber::registry().with(filter);
    let _ = match format {
        LogFormat::Text => logs
            .with(
                fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .try_init(),
        LogFormat::Json => logs
            .with(
                fmt::layer()
                    .json()
                    .with_span_list(true)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
}

/// `SHOAL_LOG`'s text as a filter; `info` without one, or with one that is not a filter.
fn log_filter(text: Option<&str>) -> tracing_subscriber::filter::Targets {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    text.and_then(|text| text.parse::<Targets>().ok())
        .unwrap_or_else(|| Targets::new().with_default(LevelFilter::INFO))
}

fn dispatch(command: Command, self_command: Vec<String>, log_format: LogFormat) -> Result<()> {
    if matches!(
        command,
        Command::Ls { .. }
            | Command::Stat { .. }
            | Command::Get(_)
            | Command::Cluster(ClusterCommand::Status(_))
    ) {
        // Listings end quietly when their reader does (`shoal ls | head`),
        // like any Unix tool. Not for `serve`: a daemon must survive clients
        // that hang up.
        // SAFETY: restoring the default disposition of one signal.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match command {
        Command::Serve {
            socket,
            capacity,
            region,
            region_size,
            line_size,
            policy,
            no_prefault,
            idle_exit,
            cluster,
            node,
            membership,
            allow_uids,
            tiers,
            elastic,
            metrics_addr,
        } => {
            let explicit = capacity;
            let capacity = capacity.unwrap_or(1 << 30);
            let mut config =
                DaemonConfig::new(socket.path(), region_size.unwrap_or(capacity).max(capacity));
            config.capacity = Some(capacity);
            let mut node_tiers = None;
            let mut node_elastic = None;
            if let (Some(file), Some(node)) = (cluster, node) {
                // `--membership` as if the file said it: the file may then
                // list only some nodes (docs/cluster.md, "Nodes absent from
                // the file"); its other membership keys are kept.
                let topology = match membership {
                    Some(url) => {
                        if !shoal_daemon::ETCD_BUILT {
                            return Err(features::missing("etcd", "`--membership`"));
                        }
                        shoal_cluster::Topology::load_with_membership(&file, &url)?
                    }
                    None => shoal_cluster::Topology::load(&file)?,
                };
                let me = topology.node(node)?.clone();
                node_tiers = Some(me.tiers.clone());
                node_elastic = me.elastic.clone();
                if socket.socket.is_none() {
                    config.socket = me.socket.clone();
                }
                config.region_size = me.region_size;
                config.capacity = Some(explicit.unwrap_or(me.region_size).min(me.region_size));
                if topology.coherence == shoal_core::coherence::CoherenceMode::Noncoherent {
                    // Objects never share a line any node's cache moves as one.
                    config.line_size = line_size.max(shoal_core::coherence::LINE as u64);
                }
                config.metrics = me.metrics;
                config.cluster = Some(shoal_daemon::ClusterConfig { topology, node });
            }
            config.region = region;
            if config.cluster.is_none() {
                config.line_size = line_size;
            }
            config.policy = policy;
            config.prefault = !no_prefault;
            config.idle_exit = idle_exit.map(Duration::from_secs_f64);
            config.stop_on_signals = true;
            config.allowed_uids = allow_uids;
            config.tiers = tiers.config(node_tiers.as_ref())?;
            config.elastic = elastic.config(node_elastic.as_ref())?;
            if metrics_addr.is_some() {
                config.metrics = metrics_addr;
            }
            shoal_daemon::serve_blocking(config, Shutdown::new())?;
            Ok(())
        }
        Command::Stat {
            socket,
            json,
            trace,
        } => {
            let mut client = Client::connect(socket.path())?;
            if trace {
                let report = client.capacity(Some(Duration::ZERO))?;
                elastic::print_trace(&report);
                return Ok(());
            }
            let s = client.stats()?;
            let t = client.tiers()?;
            let c = client.capacity(None)?;
            if json {
                println!(
                    "{{\"capacity\":{},\"region_size\":{},\"used\":{},\"objects\":{},\"sealed\":{},\"referenced\":{},\"evictable\":{},\"clients\":{},\"evictions\":{},\"evicted_bytes\":{},\"line_size\":{},\"policy\":\"{}\",\"lent\":{},\"tiers\":{},\"controller\":{},\"peer_encryption\":{}}}",
                    s.capacity, s.region_size, s.used, s.objects, s.sealed, s.referenced, s.evictable, s.clients.saturating_sub(1), s.evictions, s.evicted_bytes, s.line_size, s.policy, s.lent, tiers::report_json(&t), elastic::report_json(&c),
                    client.cluster().map_or_else(|| "null".to_owned(), |c| format!("{:?}", c.encryption))
                );
            } else {
                let pct = if s.capacity > 0 {
                    100.0 * s.used as f64 / s.capacity as f64
                } else {
                    0.0
                };
                println!("socket      {}", socket.path().display());
                println!(
                    "capacity    {} (region {})",
                    format_size(s.capacity),
                    format_size(s.region_size)
                );
                println!(
                    "used        {} ({pct:.1}%), {} lent to clients for creates",
                    format_size(s.used),
                    format_size(s.lent)
                );
                println!(
                    "objects     {} ({} sealed, {} referenced, {} evictable)",
                    s.objects, s.sealed, s.referenced, s.evictable
                );
                println!("clients     {}", s.clients.saturating_sub(1));
                println!(
                    "evictions   {} ({})",
                    s.evictions,
                    format_size(s.evicted_bytes)
                );
                println!("line size   {} B, policy {}", s.line_size, s.policy);
                if let Some(cluster) = client.cluster() {
                    println!(
                        "peers       node {}, traffic {}",
                        cluster.node, cluster.encryption
                    );
                }
                elastic::print_report(&c);
                tiers::print_report(&t);
            }
            Ok(())
        }
        Command::Ls {
            json,
            cluster: true,
            dir,
            file,
            ..
        } => cluster::ls(cluster::DirArgs { dir, file, json }),
        // The daemons it starts log the same way.
        Command::Cluster(ClusterCommand::Up(args)) => {
            cluster::up(args, &self_command, log_format.as_str())
        }
        Command::Cluster(ClusterCommand::Down(args)) => cluster::down(args),
        Command::Cluster(ClusterCommand::Status(args)) => cluster::status(args),
        Command::Cluster(ClusterCommand::Keygen(args)) => cluster::keygen(args),
        Command::Cluster(ClusterCommand::Ca(args)) => cluster_tls::ca(args),
        Command::Cluster(ClusterCommand::Cert(args)) => cluster_tls::cert(args),
        Command::Cluster(ClusterCommand::Revoke(args)) => cluster_tls::revoke(args),
        Command::Cluster(ClusterCommand::Check(args)) => cluster::check(args),
        Command::Ls { socket, json, .. } => {
            let mut client = Client::connect(socket.path())?;
            let mut objects = client.list()?;
            objects.sort_by_key(|o| o.location.offset);
            if !json {
                println!(
                    "{:<40} {:>12} {:>8} {:>6} {:>8}  TIERS",
                    "ID", "DATA", "META", "REFS", "STATE"
                );
            }
            for o in objects {
                let state = if o.sealed { "sealed" } else { "created" };
                let where_ = tiers::residence(&o);
                if json {
                    println!(
                        "{{\"id\":\"{}\",\"data_size\":{},\"meta_size\":{},\"refs\":{},\"state\":\"{state}\",\"offset\":{},\"resident\":{},\"tiers\":\"{where_}\"}}",
                        o.id, o.location.data_size, o.location.meta_size, o.refs, o.location.offset, o.resident
                    );
                } else {
                    println!(
                        "{:<40} {:>12} {:>8} {:>6} {:>8}  {where_}",
                        o.id, o.location.data_size, o.location.meta_size, o.refs, state
                    );
                }
            }
            Ok(())
        }
        Command::Mount(args) => mount::run(args),
        Command::Umount { mountpoint } => mount::unmount(&mountpoint),
        Command::StageIn(args) => tiers::stage(args, false),
        Command::StageOut(args) => tiers::stage(args, true),
        Command::Top(args) => top::run(args),
        Command::Put(args) => objects::put(args),
        Command::Get(args) => objects::get(args),
        Command::Bench(args) => bench::run(args, self_command),
        Command::BenchReader(args) => bench::reader(args),
    }
}

#[cfg(test)]
mod tests {
    use tracing::Level;

    #[test]
    fn shoal_log_takes_a_default_level_and_target_levels() {
        let filter = super::log_filter(Some("debug,h2=info,shoal_daemon::tiers=trace"));
        assert!(filter.would_enable("shoal_daemon::ops", &Level::DEBUG));
        assert!(!filter.would_enable("shoal_daemon::ops", &Level::TRACE));
        assert!(filter.would_enable("h2::proto", &Level::INFO));
        assert!(!filter.would_enable("h2::proto", &Level::DEBUG));
        assert!(filter.would_enable("shoal_daemon::tiers::drain", &Level::TRACE));
        for unset in [None, Some("not a filter=!")] {
            let filter = super::log_filter(unset);
            assert!(filter.would_enable("shoal_daemon", &Level::INFO));
            assert!(!filter.would_enable("shoal_daemon", &Level::DEBUG));
        }
    }
}
