// Preloaded into dynalite by pkg/testenv (node --require). dynalite 4.0.0
// throws from each request's 'error' listener (index.js, httpHandler), so
// a client that gives up on a request before its answer (a Go context
// cancelled mid-call, a replica killed by a test) ends the whole process,
// and every later test of the package meets "connection refused". DynamoDB
// serves on after such an abort, and so does dynalite with this guard:
// the abort is logged and that one request dropped. Any other uncaught
// error still ends the process, as it did.
'use strict'

process.on('uncaughtException', (err) => {
  if (err && err.code === 'ECONNRESET' && err.message === 'aborted') {
    console.error('dynalite: a client aborted a request; serving on')
    return
  }
  console.error(err)
  process.exit(1)
})
