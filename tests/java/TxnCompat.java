import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;

import org.apache.kafka.clients.admin.AbortTransactionSpec;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ProducerState;
import org.apache.kafka.clients.admin.TransactionDescription;
import org.apache.kafka.clients.admin.TransactionListing;
import org.apache.kafka.clients.admin.TransactionState;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.InvalidProducerEpochException;
import org.apache.kafka.common.errors.ProducerFencedException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client's transactions against a broker: {@code TxnCompat <bootstrap> <scenario> [key=value...]}.
 *
 * <p>Scenarios:
 * <ul>
 * <li>{@code produce}: transactions over {@code layout} (topic:partitions,...), {@code per} records per partition,
 *     {@code outcomes} (c = commit, a = abort, one letter per transaction); values as tests/txn_support.py's
 *     plan_transactions, so Python computes what every reader must see.</li>
 * <li>{@code read}: assign every partition of {@code layout} from the beginning with {@code isolation} until
 *     {@code count} records, printing {@code SEEN topic partition offset value} per record.</li>
 * <li>{@code fence}: two producers with one transactional id; the older one must be fenced.</li>
 * <li>{@code offsets}: sendOffsetsToTransaction with a group member's metadata; a read_committed consumer's
 *     committed() (OffsetFetch with require_stable) waits for the commit; an abort leaves the offsets.</li>
 * <li>{@code admin}: listTransactions, describeTransactions and describeProducers of an open transaction, then
 *     Admin.abortTransaction (KIP-664: WriteTxnMarkers from the admin client) of a second one.</li>
 * <li>{@code eos}: the exactly-once consume-transform-produce loop, until killed ({@code COMMITTED n} lines).</li>
 * </ul>
 * Prints {@code OK ...} per passed check and {@code DONE <scenario>} at the end; a failure prints {@code FAIL}
 * and exits 1.
 */
public final class TxnCompat {
    static final Duration POLL = Duration.ofMillis(200);

    final String bootstrap;
    final Map<String, String> args;

    TxnCompat(String bootstrap, Map<String, String> args) {
        this.bootstrap = bootstrap;
        this.args = args;
    }

    public static void main(String[] argv) {
        Map<String, String> a = new HashMap<>();
        for (int i = 2; i < argv.length; i++) {
            int eq = argv[i].indexOf('=');
            a.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        TxnCompat t = new TxnCompat(argv[0], a);
        String scenario = argv[1];
        try {
            switch (scenario) {
                case "produce": t.produce(); break;
                case "read": t.read(); break;
                case "fence": t.fence(); break;
                case "offsets": t.offsets(); break;
                case "eos": t.eos(); break;
                case "admin": t.admin(); break;
                default: throw new Check("unknown scenario " + scenario);
            }
        } catch (Throwable e) {
            System.out.println("FAIL " + scenario + ": " + e);
            System.out.flush();
            e.printStackTrace();
            System.exit(1);
        }
        System.out.println("DONE " + scenario);
        System.out.flush();
        System.exit(0);
    }

    // ------------------------------------------------------------------ scenarios

    void produce() throws Exception {
        Map<String, Integer> layout = layout();
        int per = Integer.parseInt(args.get("per"));
        String outcomes = args.get("outcomes");
        String tag = args.get("tag");
        try (KafkaProducer<byte[], byte[]> p = producer(args.get("txnid"), Collections.emptyMap())) {
            p.initTransactions();
            for (int n = 0; n < outcomes.length(); n++) {
                char o = outcomes.charAt(n);
                p.beginTransaction();
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (Map.Entry<String, Integer> e : layout.entrySet()) {
                    for (int part = 0; part < e.getValue(); part++) {
                        for (int i = 0; i < per; i++) {
                            String v = String.format("%s-x%d-%c-%s-%d-%d", tag, n, o, e.getKey(), part, i);
                            sent.add(p.send(new ProducerRecord<>(e.getKey(), part, null, v.getBytes(UTF_8))));
                        }
                    }
                }
                // acknowledged before the transaction ends, so that an abort has written data to abort
                for (Future<RecordMetadata> f : sent) f.get();
                if (o == 'c') p.commitTransaction(); else p.abortTransaction();
                ok("transaction %d %s (%d records)", n, o == 'c' ? "committed" : "aborted", sent.size());
            }
        }
    }

    void read() {
        Map<String, Integer> layout = layout();
        int count = Integer.parseInt(args.get("count"));
        List<TopicPartition> tps = new ArrayList<>();
        layout.forEach((t, n) -> { for (int p = 0; p < n; p++) tps.add(new TopicPartition(t, p)); });
        Map<String, Object> conf = new HashMap<>();
        conf.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, args.get("isolation"));
        try (KafkaConsumer<byte[], byte[]> c = consumer(null, conf)) {
            c.assign(tps);
            c.seekToBeginning(tps);
            int got = 0;
            long deadline = System.currentTimeMillis() + 30_000;
            while (got < count && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(POLL)) {
                    System.out.println("SEEN " + r.topic() + " " + r.partition() + " " + r.offset() + " "
                            + new String(r.value(), UTF_8));
                    got++;
                }
            }
            ok("read %d records (%s)", got, args.get("isolation"));
        }
    }

    void fence() throws Exception {
        String topic = args.get("topic");
        String txnId = args.get("txnid");
        try (KafkaProducer<byte[], byte[]> old = producer(txnId, Collections.emptyMap());
             KafkaProducer<byte[], byte[]> young = producer(txnId, Collections.emptyMap())) {
            old.initTransactions();
            old.beginTransaction();
            old.send(new ProducerRecord<>(topic, 0, null, "zombie".getBytes(UTF_8))).get();
            young.initTransactions();  // bumps the epoch, aborts the zombie's transaction
            young.beginTransaction();
            young.send(new ProducerRecord<>(topic, 0, null, "young".getBytes(UTF_8))).get();
            young.commitTransaction();
            ok("young producer committed");
            try {
                old.send(new ProducerRecord<>(topic, 0, null, "zombie-late".getBytes(UTF_8))).get();
                old.commitTransaction();
                throw new Check("the zombie producer committed");
            } catch (Exception e) {
                Throwable cause = e;
                while (cause != null && !(cause instanceof ProducerFencedException)
                        && !(cause instanceof InvalidProducerEpochException)) {
                    cause = cause.getCause();
                }
                check(cause != null, "the zombie failed with %s, not fenced", e);
                ok("zombie fenced: %s", cause.getClass().getSimpleName());
            }
        }
    }

    void offsets() throws Exception {
        String input = args.get("input");
        String output = args.get("output");
        String group = args.get("group");
        TopicPartition tp = new TopicPartition(input, 0);
        Map<String, Object> conf = new HashMap<>();
        conf.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        try (KafkaConsumer<byte[], byte[]> member = consumer(group, conf);
             KafkaProducer<byte[], byte[]> p = producer(args.get("txnid"), Collections.emptyMap())) {
            member.subscribe(Collections.singletonList(input));
            int got = 0;
            long deadline = System.currentTimeMillis() + 30_000;
            while (got < 10 && System.currentTimeMillis() < deadline) got += member.poll(POLL).count();
            check(got == 10, "the group member read %d of 10", got);
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(output, 0, null, "out-0".getBytes(UTF_8))).get();
            p.sendOffsetsToTransaction(Collections.singletonMap(tp, new OffsetAndMetadata(5)), member.groupMetadata());

            // committed() of a read_committed consumer asks with require_stable and waits out the pending commit
            AtomicLong answeredAt = new AtomicLong();
            AtomicReference<Object> answer = new AtomicReference<>();
            Thread waiter = new Thread(() -> {
                try (KafkaConsumer<byte[], byte[]> c = consumer(group, conf)) {
                    OffsetAndMetadata om = c.committed(Collections.singleton(tp), Duration.ofSeconds(30)).get(tp);
                    answer.set(om == null ? "none" : (Object) om.offset());
                } catch (Exception e) {
                    answer.set(e);
                }
                answeredAt.set(System.nanoTime());
            });
            waiter.start();
            Thread.sleep(1500);
            check(answer.get() == null, "committed() answered %s while the offsets were pending", answer.get());
            long commitAt = System.nanoTime();
            p.commitTransaction();
            waiter.join(40_000);
            check(Long.valueOf(5).equals(answer.get()) && answeredAt.get() >= commitAt,
                    "committed() after the commit: %s", answer.get());
            ok("require_stable committed() waited for the commit and saw 5");

            p.beginTransaction();
            p.send(new ProducerRecord<>(output, 0, null, "out-1".getBytes(UTF_8))).get();
            p.sendOffsetsToTransaction(Collections.singletonMap(tp, new OffsetAndMetadata(8)), member.groupMetadata());
            p.abortTransaction();
            try (KafkaConsumer<byte[], byte[]> c = consumer(group, conf)) {
                OffsetAndMetadata om = c.committed(Collections.singleton(tp), Duration.ofSeconds(30)).get(tp);
                check(om != null && om.offset() == 5, "after the abort: %s", om);
            }
            ok("aborted offsets vanished");
        }
    }

    void eos() {
        String input = args.get("input");
        String output = args.get("output");
        Map<String, Object> cconf = new HashMap<>();
        cconf.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cconf.put(ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, 6000);
        cconf.put(ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, 500);
        cconf.put(ConsumerConfig.MAX_POLL_INTERVAL_MS_CONFIG, 20000);
        cconf.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, 500);
        Map<String, Object> pconf = new HashMap<>();
        pconf.put(ProducerConfig.TRANSACTION_TIMEOUT_CONFIG, 20000);
        pconf.put(ProducerConfig.LINGER_MS_CONFIG, 5);
        KafkaConsumer<byte[], byte[]> c = consumer(args.get("group"), cconf);
        KafkaProducer<byte[], byte[]> p = producer(args.get("txnid"), pconf);
        p.initTransactions();
        c.subscribe(Collections.singletonList(input));
        while (true) {
            ConsumerRecords<byte[], byte[]> records = c.poll(POLL);
            if (records.isEmpty()) continue;
            try {
                p.beginTransaction();
                Map<TopicPartition, OffsetAndMetadata> next = new HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    byte[] v = ("out-" + new String(r.value(), UTF_8)).getBytes(UTF_8);
                    p.send(new ProducerRecord<>(output, r.key(), v));
                    next.put(new TopicPartition(r.topic(), r.partition()), new OffsetAndMetadata(r.offset() + 1));
                }
                p.sendOffsetsToTransaction(next, c.groupMetadata());
                p.commitTransaction();
                System.out.println("COMMITTED " + records.count());
            } catch (ProducerFencedException | InvalidProducerEpochException e) {
                System.out.println("FATAL " + e);
                System.exit(3);
            } catch (KafkaException e) {
                // abortable: the aborted output is gone, so go back to the group's committed offsets
                p.abortTransaction();
                Set<TopicPartition> assigned = c.assignment();
                Map<TopicPartition, OffsetAndMetadata> committed = c.committed(assigned);
                for (TopicPartition tp : assigned) {
                    OffsetAndMetadata om = committed.get(tp);
                    if (om == null) c.seekToBeginning(Collections.singleton(tp)); else c.seek(tp, om.offset());
                }
                System.out.println("ABORTED " + e);
            }
            System.out.flush();
        }
    }

    void admin() throws Exception {
        String topic = args.get("topic");
        String txnId = args.get("txnid");
        TopicPartition tp = new TopicPartition(topic, 0);
        Properties ap = new Properties();
        ap.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(ap);
             KafkaProducer<byte[], byte[]> p = producer(txnId, Collections.emptyMap())) {
            p.initTransactions();
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, 0, null, "open".getBytes(UTF_8))).get();

            Collection<TransactionListing> listed = admin.listTransactions().all().get();
            TransactionListing mine = listed.stream().filter(l -> l.transactionalId().equals(txnId)).findFirst()
                    .orElseThrow(() -> new Check("listTransactions: " + txnId + " not in " + listed));
            check(mine.state() == TransactionState.ONGOING, "listTransactions state %s", mine.state());
            ok("listTransactions %s ONGOING", txnId);

            TransactionDescription d = admin.describeTransactions(Collections.singleton(txnId)).description(txnId).get();
            check(d.state() == TransactionState.ONGOING && d.topicPartitions().equals(Collections.singleton(tp))
                    && d.producerId() == mine.producerId() && d.transactionTimeoutMs() > 0
                    && d.transactionStartTimeMs().isPresent(), "describeTransactions %s", d);
            ok("describeTransactions ONGOING on %s", tp);

            List<ProducerState> active = admin.describeProducers(Collections.singleton(tp)).partitionResult(tp).get()
                    .activeProducers();
            ProducerState ps = active.stream().filter(x -> x.producerId() == d.producerId()).findFirst()
                    .orElseThrow(() -> new Check("describeProducers: no " + d.producerId() + " in " + active));
            check(ps.currentTransactionStartOffset().isPresent() && ps.currentTransactionStartOffset().getAsLong() == 0,
                    "describeProducers %s", ps);
            ok("describeProducers current transaction from offset 0");

            p.commitTransaction();
            long deadline = System.currentTimeMillis() + 15_000;
            TransactionState after;
            do {
                after = admin.describeTransactions(Collections.singleton(txnId)).description(txnId).get().state();
            } while (after != TransactionState.COMPLETE_COMMIT && System.currentTimeMillis() < deadline);
            check(after == TransactionState.COMPLETE_COMMIT, "after the commit: %s", after);
            ok("describeTransactions COMPLETE_COMMIT");

            // A transaction the coordinator still has open, aborted on the partition by the admin client
            p.beginTransaction();
            p.send(new ProducerRecord<>(topic, 0, null, "hanging".getBytes(UTF_8))).get();
            ProducerState open = admin.describeProducers(Collections.singleton(tp)).partitionResult(tp).get()
                    .activeProducers().stream().filter(x -> x.producerId() == d.producerId()).findFirst().get();
            check(open.currentTransactionStartOffset().isPresent(), "no open transaction: %s", open);
            admin.abortTransaction(new AbortTransactionSpec(tp, open.producerId(), (short) open.producerEpoch(),
                    open.coordinatorEpoch().orElse(0))).all().get();
            ProducerState closed = admin.describeProducers(Collections.singleton(tp)).partitionResult(tp).get()
                    .activeProducers().stream().filter(x -> x.producerId() == d.producerId()).findFirst().get();
            check(!closed.currentTransactionStartOffset().isPresent(), "still open after abortTransaction: %s", closed);
            ok("abortTransaction closed the transaction on %s", tp);
        }
    }

    // ------------------------------------------------------------------ helpers

    Map<String, Integer> layout() {
        Map<String, Integer> out = new LinkedHashMap<>();
        for (String part : args.get("layout").split(",")) {
            String[] kv = part.split(":");
            out.put(kv[0], Integer.parseInt(kv[1]));
        }
        return out;
    }

    KafkaProducer<byte[], byte[]> producer(String txnId, Map<String, Object> extra) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, txnId);
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, 30000);
        p.putAll(extra);
        return new KafkaProducer<>(p);
    }

    KafkaConsumer<byte[], byte[]> consumer(String group, Map<String, Object> extra) {
        Properties p = new Properties();
        p.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        if (group != null) p.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, false);
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, 100);
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    static final class Check extends RuntimeException {
        private static final long serialVersionUID = 1L;

        Check(String msg) {
            super(msg);
        }
    }

    static void check(boolean cond, String fmt, Object... a) {
        if (!cond) throw new Check(String.format(fmt, a));
    }

    static void ok(String fmt, Object... a) {
        System.out.println("OK " + String.format(fmt, a));
        System.out.flush();
    }
}
