/* `lmcache-cli trace replay TRACE --server URL` (docs/cli.md, "trace
 * replay"): a storage trace replayed against a live lmcached started with
 * --allow-trace-replay, through its POST /api/trace/replay. */
#ifndef LMC_CLI_CLI_TRACE_REPLAY_H
#define LMC_CLI_CLI_TRACE_REPLAY_H

/* argv: the words after "trace replay".  Exit status: 0; 1 when the trace
 * is refused (the byte offset named) or the server refused or failed a
 * batch; 2 for bad usage. */
int lmc_cli_trace_replay_main(int argc, char **argv);

#endif
