"""The operations console (`seamq console`, docs/console.md): what seamq holds, in a browser, and
the repairs people make (replay, purge, edit and replay dead letters; retry, cancel, pause jobs).
Pages are rendered on the server; the rules are seamq.dlq_desk's and the job server's."""
