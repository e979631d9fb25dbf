//! Arguments several commands share: the daemon's socket (and where it is by
//! default), sizes such as `4GiB`.

use std::path::PathBuf;

use shoal_core::local_auth::default_socket;
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

pub fn size(text: &str) -> Result<u64, String> {
    parse_size(text)
}
