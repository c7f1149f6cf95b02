//! "Runtime/Memory" group: threads, devices, placement, memory budget, attention kernels.

use clap::ArgAction;

/// Where and how computation runs.
#[derive(Debug, Clone, clap::Args)]
#[command(next_help_heading = "Runtime/Memory")]
pub struct RuntimeArgs {
    /// number of threads to use during computation; <= 0 = the number of physical CPU cores
    #[arg(short = 't', long = "threads", value_name = "INT", default_value_t = -1, allow_negative_numbers = true)]
    pub threads: i32,

    /// runtime backend assignment, e.g. cpu or clip=cpu,vae=cuda0,diffusion=vulkan0; repeats are joined
    #[arg(long = "backend", value_name = "SPEC", action = ArgAction::Append, allow_hyphen_values = true)]
    pub backend: Vec<String>,

    /// parameter backend assignment, e.g. disk, cpu, or diffusion=disk,clip=cpu; repeats are joined
    #[arg(long = "params-backend", value_name = "SPEC", action = ArgAction::Append, allow_hyphen_values = true)]
    pub params_backend: Vec<String>,

    /// weight distribution for modules assigned multiple devices: layer (default) or row, or per
    /// module, e.g. diffusion=row,te=layer; repeats are joined
    #[arg(long = "split-mode", value_name = "SPEC", action = ArgAction::Append, allow_hyphen_values = true)]
    pub split_mode: Vec<String>,

    /// comma-separated RPC servers (host:port) whose devices (RPC0, RPC1, ...) can be used in
    /// --backend; repeats are joined
    #[arg(long = "rpc-servers", visible_alias = "rpc", value_name = "LIST", action = ArgAction::Append, allow_hyphen_values = true)]
    pub rpc_servers: Vec<String>,

    /// serve this machine's devices (--backend names them; default: its GPUs, else the CPU)
    /// to other sd-cli runs over ggml RPC until stopped; unauthenticated, see docs/rpc.md
    #[arg(long = "rpc-server")]
    pub rpc_server: bool,

    /// address the RPC server listens on (anything but loopback lets others on the network
    /// run work on this machine)
    #[arg(
        long = "host",
        value_name = "HOST",
        default_value = "127.0.0.1",
        requires = "rpc_server"
    )]
    pub host: String,

    /// port the RPC server listens on
    #[arg(
        long = "port",
        value_name = "PORT",
        default_value_t = 50052,
        requires = "rpc_server"
    )]
    pub port: u16,

    /// directory where the RPC server keeps large tensors clients sent, so a client that
    /// reconnects does not send them again
    #[arg(
        long = "rpc-cache",
        value_name = "DIR",
        requires = "rpc_server",
        allow_hyphen_values = true
    )]
    pub rpc_cache: Option<std::path::PathBuf>,

    /// VRAM budget in GiB for graph-cut segmented execution: a value or per-device assignments
    /// (e.g. 6 or cuda0=6,vulkan0=4); 0 disables graph splitting; a negative value auto-detects
    /// free VRAM, sparing that amount
    #[arg(
        long = "max-vram",
        value_name = "GIB|SPEC",
        default_value = "0",
        allow_hyphen_values = true
    )]
    pub max_vram: String,

    /// place the weights in RAM to save VRAM, and load them into VRAM when needed
    #[arg(long = "offload-to-cpu")]
    pub offload_to_cpu: bool,

    /// enable residency+prefetch streaming on top of --max-vram (no effect without --max-vram)
    #[arg(long = "stream-layers")]
    pub stream_layers: bool,

    /// do not prefetch the next segment's weights during segmented execution
    #[arg(long = "disable-prefetch")]
    pub disable_prefetch: bool,

    /// never split graphs into segments, even when they exceed the memory budget
    #[arg(long = "disable-segmented-compute")]
    pub disable_segmented_compute: bool,

    /// load all params at model-load time instead of lazily on first use
    #[arg(long = "eager-load")]
    pub eager_load: bool,

    /// pick device placements automatically from model size and per-device memory budgets
    #[arg(long = "auto-fit")]
    pub auto_fit: bool,

    /// memory-map the model files
    #[arg(long = "mmap")]
    pub mmap: bool,

    /// keep the text encoders on the CPU (deprecated upstream; same as --backend te=cpu)
    #[arg(long = "clip-on-cpu")]
    pub clip_on_cpu: bool,

    /// keep the control net on the CPU (deprecated upstream; same as --backend controlnet=cpu)
    #[arg(long = "control-net-cpu")]
    pub control_net_cpu: bool,

    /// use flash attention (reduced precision: K/V in f16; on CPUs with AVX-512 BF16 and
    /// bf16 or quantized weights, bf16 operands)
    #[arg(long = "fa")]
    pub fa: bool,

    /// use flash attention in the diffusion model only
    #[arg(long = "diffusion-fa")]
    pub diffusion_fa: bool,

    /// use direct 2D convolution in the diffusion model
    #[arg(long = "diffusion-conv-direct")]
    pub diffusion_conv_direct: bool,
}
