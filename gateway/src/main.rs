//! The `nereid-gateway` binary (`nereid_gateway::command`).

fn main() -> std::process::ExitCode {
    nereid_gateway::command::main(std::env::args_os())
}
