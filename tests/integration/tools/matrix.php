<?php
// PHP (php-memcached, text protocol) scenarios for test_tool_matrix.py.
// Usage: php matrix.php HOST PORT CASE   prints the case's outcome as one JSON document.
// Every call's result code is reported beside its result, so a difference in what the server
// answered shows even where the PHP return value is the same.

[$_, $host, $port, $case] = $argv;

function client($host, $port) {
    $m = new Memcached();
    $m->setOption(Memcached::OPT_BINARY_PROTOCOL, false);
    $m->setOption(Memcached::OPT_CONNECT_TIMEOUT, 2000);   // ms
    $m->setOption(Memcached::OPT_RECV_TIMEOUT, 3000000);   // us
    $m->setOption(Memcached::OPT_SEND_TIMEOUT, 3000000);   // us
    $m->setOption(Memcached::OPT_POLL_TIMEOUT, 3000);      // ms
    $m->setOption(Memcached::OPT_COMPRESSION, false);
    $m->addServer($host, (int)$port);
    return $m;
}

function rc($m) { return $m->getResultCode(); }

$m = client($host, $port);
$o = [];
switch ($case) {
case 'basic':
    $o['set'] = [$m->set('php_a', 'alpha'), rc($m)];
    $o['set_int'] = [$m->set('php_n', 42), rc($m)];
    $o['set_array'] = [$m->set('php_arr', ['x' => [1, 2]]), rc($m)];
    $o['get'] = [$m->get('php_a'), $m->get('php_n'), $m->get('php_arr')];
    $o['miss'] = [$m->get('php_absent'), rc($m) == Memcached::RES_NOTFOUND];
    $o['setMulti'] = [$m->setMulti(['php_m1' => 'one', 'php_m2' => str_repeat('z', 200000)]), rc($m)];
    $multi = $m->getMulti(['php_m1', 'php_absent', 'php_m2', 'php_a']);
    $o['getMulti'] = [array_keys($multi), strlen($multi['php_m2'] ?? ''), rc($m)];
    $o['delete'] = [$m->delete('php_a'), $m->delete('php_a'), rc($m) == Memcached::RES_NOTFOUND,
                    $m->get('php_a')];
    break;
case 'cas':
    $m->set('php_c', 'one');
    $r = $m->get('php_c', null, Memcached::GET_EXTENDED);
    $o['extended'] = [$r['value'], is_int($r['cas']) && $r['cas'] > 0];
    $o['cas'] = [$m->cas($r['cas'], 'php_c', 'two'), rc($m)];
    $o['stale'] = [$m->cas($r['cas'], 'php_c', 'three'), rc($m) == Memcached::RES_DATA_EXISTS];
    $o['absent'] = [$m->cas($r['cas'], 'php_absent', 'x'), rc($m) == Memcached::RES_NOTFOUND];
    $o['final'] = $m->get('php_c');
    break;
case 'increment':
    $m->set('php_i', '10');
    $o['inc'] = [$m->increment('php_i', 5), $m->decrement('php_i', 100), $m->get('php_i')];
    $o['absent'] = [$m->increment('php_absent'), rc($m) == Memcached::RES_NOTFOUND];
    $o['append'] = [$m->append('php_i', '7'), $m->prepend('php_i', '1'), $m->get('php_i')];
    $o['touch'] = [$m->touch('php_i', 100), $m->add('php_i', 'x'), $m->replace('php_i', 'y'),
                   $m->get('php_i')];
    break;
case 'getAllKeys':
    // memcached lists a fresh item only once its LRU maintainer has moved it: wait up to 5 s
    $want = [];
    for ($i = 0; $i < 20; $i++) { $want[] = "php_key_$i"; $m->set("php_key_$i", "v$i"); }
    $deadline = microtime(true) + 5;
    do {
        $keys = $m->getAllKeys();
        $code = rc($m);
        if (!is_array($keys) || !array_diff($want, $keys)) break;
        usleep(200000);
    } while (microtime(true) < $deadline);
    if (is_array($keys)) sort($keys);
    $o = ['keys' => $keys, 'code' => $code];
    break;
case 'getStats':
    $m->set('php_s', 'v');
    $m->get('php_s');
    $m->get('php_absent');
    $stats = $m->getStats();
    $s = is_array($stats) ? ($stats["$host:$port"] ?? null) : null;
    $o = ['servers' => is_array($stats) ? count($stats) : $stats, 'named' => $s !== null,
          'figures' => $s === null ? null : [$s['curr_items'] ?? null, $s['get_hits'] ?? null,
                                             $s['get_misses'] ?? null, $s['cmd_set'] ?? null,
                                             $s['limit_maxbytes'] ?? null]];
    $v = $m->getVersion();
    $o['version'] = is_array($v) ? count($v) : $v;
    break;
default:
    fwrite(STDERR, "unknown case $case\n");
    exit(2);
}
echo json_encode($o), "\n";
