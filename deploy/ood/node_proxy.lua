-- What Open OnDemand's /node/<host>/<port>/ rule does to a request (mod_ood_proxy's
-- node_proxy_handler and set_reverse_proxy), for the testbed: hand it to mod_proxy, the path
-- unchanged (the app serves under the same prefix), websockets (an Upgrade header) as ws://.
-- OOD also maps the authenticated user to a system user first; the testbed has no front login.
function node_proxy_handler(r)
  local host = r.subprocess_env['MATCH_HOST']
  local port = r.subprocess_env['MATCH_PORT']
  local scheme = r.headers_in['Upgrade'] and 'ws://' or 'http://'
  r.handler = 'proxy-server'
  r.proxyreq = apache2.PROXYREQ_REVERSE
  r.filename = 'proxy:' .. scheme .. host .. ':' .. port .. r.uri
  r.headers_in['X-Forwarded-Proto'] = r.is_https and 'https' or 'http'
  r.headers_in['X-Forwarded-User'] = r.user or ''
  r:custom_response(503, 'Failed to connect to ' .. host .. ':' .. port)
  return apache2.DECLINED
end
