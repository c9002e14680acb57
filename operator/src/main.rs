//! The `nereid-operator` binary (`nereid_operator::command`).

fn main() -> std::process::ExitCode {
    nereid_operator::command::main(std::env::args_os())
}
