//! Arguments several commands share: the daemon's socket (and where it is by
//! default), sizes such as `4GiB`.

use std::path::PathBuf;

use shoal_core::units::parse_size;

#[derive(clap::Args, Debug, Clone)]
pub struct SocketArg {
    /// The daemon's Unix socket [default: $SHOAL_SOCKET, else
    /// $XDG_RUNTIME_DIR/shoal/default.sock, else /tmp/shoal-$UID/default.sock].
    #[arg(long, short = 's', env = "SHOAL_SOCKET")]
    pub socket: Option<PathBuf>,
}

impl SocketArg {
    pub fn path(&self) -> PathBuf {
        self.socket.clone().unwrap_or_else(default_socket)
    }
}

/// The socket `shoal serve` and `shoal.connect()` use when none is given:
/// `$XDG_RUNTIME_DIR/shoal/default.sock` when that directory is set and
/// trusted (ours, not writable by others), else `/tmp/shoal-$UID/default.sock`.
/// Either directory is checked again (and refused if another user made it)
/// before a daemon binds there.
pub fn default_socket() -> PathBuf {
    default_socket_dir().join("default.sock")
}

fn default_socket_dir() -> PathBuf {
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        if runtime.is_absolute() && shoal_core::local_auth::check_trusted_dir(&runtime).is_ok() {
            return runtime.join("shoal");
        }
    }
    PathBuf::from(format!("/tmp/shoal-{}", shoal_core::local_auth::my_uid()))
}

pub fn size(text: &str) -> Result<u64, String> {
    parse_size(text)
}
