import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DeletedRecords;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.quota.ClientQuotaAlteration;
import org.apache.kafka.common.quota.ClientQuotaEntity;
import org.apache.kafka.common.quota.ClientQuotaFilter;
import org.apache.kafka.common.quota.ClientQuotaFilterComponent;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.record.TimestampType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Drives the official Java Kafka client against a broker: {@code KafkaCompat <bootstrap> <scenario> [key=value...]}.
 *
 * <p>Scenarios: admin, produce, consume, group, rebalance, quotas, sessions; {@code produce,consume} runs both in
 * one JVM.
 *
 * <p>Prints machine-checkable lines: {@code OK <what> ...} for each passed check, {@code INFO <json>} for facts
 * the caller may cross-check, and finally {@code DONE <scenario>}. Any failed check or client exception prints
 * {@code FAIL <message>} plus the stack trace on stderr and exits 1.
 *
 * <p>Records are generated deterministically from a tag and an index (see {@link #key}, {@link #value},
 * {@link #headers}, {@link #timestamp}); tests/java/test_java_client.py has the same generator, so records
 * produced by one client can be checked when read by another.
 */
public final class KafkaCompat {
    static final long BASE_TS = 1_700_000_000_000L;
    static final Duration POLL = Duration.ofMillis(200);
    static final long DEADLINE_MS = 60_000;

    final String bootstrap;
    final Map<String, String> args;

    KafkaCompat(String bootstrap, Map<String, String> args) {
        this.bootstrap = bootstrap;
        this.args = args;
    }

    public static void main(String[] argv) {
        if (argv.length < 2) {
            System.err.println("usage: KafkaCompat <bootstrap> <scenario> [key=value...]");
            System.exit(2);
        }
        Map<String, String> a = new HashMap<>();
        for (int i = 2; i < argv.length; i++) {
            int eq = argv[i].indexOf('=');
            if (eq < 0) {
                System.err.println("bad argument (want key=value): " + argv[i]);
                System.exit(2);
            }
            a.put(argv[i].substring(0, eq), argv[i].substring(eq + 1));
        }
        KafkaCompat k = new KafkaCompat(argv[0], a);
        String scenario = argv[1];
        try {
            // Several scenarios separated by commas run one after the other in this JVM.
            for (String s : scenario.split(",")) {
                switch (s) {
                    case "admin": k.adminScenario(); break;
                    case "produce": k.produce(); break;
                    case "consume": k.consume(); break;
                    case "group": k.group(); break;
                    case "rebalance": k.rebalance(); break;
                    case "quotas": k.quotas(); break;
                    case "sessions": k.sessions(); break;
                    default: throw new Check("unknown scenario " + s);
                }
            }
        } catch (Throwable t) {
            System.out.println("FAIL " + scenario + ": " + t);
            System.out.flush();
            t.printStackTrace();
            System.exit(1);
        }
        System.out.println("DONE " + scenario);
        System.out.flush();
        // Kafka's client threads are daemons, but be explicit: never hang the caller.
        System.exit(0);
    }

    /** AlterClientQuotas and DescribeClientQuotas through the Java Admin client. */
    void quotas() throws Exception {
        String clientId = args.getOrDefault("client", "java-quota-client");
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(p)) {
            ClientQuotaEntity entity = new ClientQuotaEntity(Collections.singletonMap(ClientQuotaEntity.CLIENT_ID, clientId));
            admin.alterClientQuotas(Collections.singletonList(new ClientQuotaAlteration(entity, Arrays.asList(
                    new ClientQuotaAlteration.Op("producer_byte_rate", 65536.0),
                    new ClientQuotaAlteration.Op("consumer_byte_rate", 131072.0))))).all().get();
            ok("alterClientQuotas %s", clientId);
            Map<ClientQuotaEntity, Map<String, Double>> got = admin.describeClientQuotas(ClientQuotaFilter.containsOnly(
                    Collections.singletonList(ClientQuotaFilterComponent.ofEntity(ClientQuotaEntity.CLIENT_ID, clientId))))
                    .entities().get();
            Map<String, Double> values = got.get(entity);
            check(values != null && values.get("producer_byte_rate") == 65536.0
                    && values.get("consumer_byte_rate") == 131072.0, "describeClientQuotas returned %s", got);
            ok("describeClientQuotas %s", values);
            try {
                admin.alterClientQuotas(Collections.singletonList(new ClientQuotaAlteration(entity,
                        Collections.singletonList(new ClientQuotaAlteration.Op("producer_byte_rate", -5.0))))).all().get();
                throw new Check("a negative quota was accepted");
            } catch (ExecutionException e) {
                check(e.getCause() instanceof org.apache.kafka.common.errors.InvalidRequestException,
                        "negative quota gave %s", e.getCause());
                ok("alterClientQuotas negative refused");
            }
            admin.alterClientQuotas(Collections.singletonList(new ClientQuotaAlteration(entity, Arrays.asList(
                    new ClientQuotaAlteration.Op("producer_byte_rate", null),
                    new ClientQuotaAlteration.Op("consumer_byte_rate", null))))).all().get();
            got = admin.describeClientQuotas(ClientQuotaFilter.all()).entities().get();
            check(!got.containsKey(entity), "removed quotas still described: %s", got);
            ok("alterClientQuotas remove");
        }
    }

    // ------------------------------------------------------------------ helpers

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

    static void info(Map<String, ?> m) {
        System.out.println("INFO " + json(m));
        System.out.flush();
    }

    static String json(Object o) {
        if (o == null) return "null";
        if (o instanceof Number || o instanceof Boolean) return o.toString();
        if (o instanceof Map) {
            StringBuilder sb = new StringBuilder("{");
            for (Map.Entry<?, ?> e : ((Map<?, ?>) o).entrySet()) {
                if (sb.length() > 1) sb.append(',');
                sb.append(json(String.valueOf(e.getKey()))).append(':').append(json(e.getValue()));
            }
            return sb.append('}').toString();
        }
        if (o instanceof Collection) {
            return ((Collection<?>) o).stream().map(KafkaCompat::json).collect(Collectors.joining(",", "[", "]"));
        }
        StringBuilder sb = new StringBuilder("\"");
        for (char c : o.toString().toCharArray()) {
            if (c == '"' || c == '\\') sb.append('\\').append(c);
            else if (c < 0x20) sb.append(String.format("\\u%04x", (int) c));
            else sb.append(c);
        }
        return sb.append('"').toString();
    }

    static Map<String, Object> map(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < kv.length; i += 2) m.put((String) kv[i], kv[i + 1]);
        return m;
    }

    String arg(String name) {
        String v = args.get(name);
        if (v == null) throw new Check("missing argument " + name + "=");
        return v;
    }

    String arg(String name, String dflt) {
        return args.getOrDefault(name, dflt);
    }

    int count() {
        return Integer.parseInt(arg("count", "10000"));
    }

    String tag() {
        return arg("tag", arg("topic"));
    }

    static <T> T get(Future<T> f) throws Exception {
        try {
            return f.get();
        } catch (ExecutionException e) {
            throw e.getCause() instanceof Exception ? (Exception) e.getCause() : e;
        }
    }

    // ------------------------------------------------------------------ the record generator (mirrored in Python)

    static byte[] key(String tag, int i) {
        return (tag + "-key-" + i).getBytes(UTF_8);
    }

    /** Every 101st record is a tombstone (null value); the others are compressible text of varying length. */
    static byte[] value(String tag, int i) {
        if (i % 101 == 0) return null;
        return (tag + "-value-" + i + "-" + "abcdefghij".repeat(i % 20)).getBytes(UTF_8);
    }

    /** Two headers always; every third record also carries a header with an empty value. */
    static List<Header> headers(String tag, int i) {
        List<Header> h = new ArrayList<>();
        h.add(new RecordHeader("idx", Integer.toString(i).getBytes(UTF_8)));
        h.add(new RecordHeader("tag", tag.getBytes(UTF_8)));
        if (i % 3 == 0) h.add(new RecordHeader("empty", new byte[0]));
        return h;
    }

    static long timestamp(int i) {
        return BASE_TS + 10L * i;
    }

    static int indexOf(String tag, byte[] key) {
        check(key != null, "record without key");
        String s = new String(key, UTF_8);
        String prefix = tag + "-key-";
        check(s.startsWith(prefix), "unexpected key %s (want prefix %s)", s, prefix);
        return Integer.parseInt(s.substring(prefix.length()));
    }

    static String show(byte[] b) {
        return b == null ? "null" : "'" + new String(b, UTF_8) + "'";
    }

    static String showHeaders(Iterable<Header> hs) {
        List<String> out = new ArrayList<>();
        for (Header h : hs) out.add(h.key() + "=" + show(h.value()));
        return out.toString();
    }

    // ------------------------------------------------------------------ clients

    Properties common() {
        Properties p = new Properties();
        p.put("bootstrap.servers", bootstrap);
        p.put("client.id", "kbroker-java-compat");
        return p;
    }

    Admin newAdmin() {
        Properties p = common();
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "30000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
        return Admin.create(p);
    }

    KafkaConsumer<byte[], byte[]> consumer(Map<String, String> extra) {
        Properties p = common();
        p.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        p.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        p.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        p.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "100");
        p.putAll(extra);
        return new KafkaConsumer<>(p);
    }

    void createTopic(Admin admin, String topic, int partitions) throws Exception {
        get(admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all());
        createTopicWait(admin, topic, partitions);
    }

    // ------------------------------------------------------------------ scenario: admin

    void adminScenario() throws Exception {
        String topic = arg("topic");
        try (Admin admin = newAdmin()) {
            // describeCluster: cluster id, controller, nodes.
            DescribeClusterResult dc = admin.describeCluster();
            String clusterId = get(dc.clusterId());
            Node controller = get(dc.controller());
            Collection<Node> nodes = get(dc.nodes());
            check(clusterId != null && !clusterId.isEmpty(), "empty cluster id");
            check(controller != null && !controller.isEmpty(), "no controller");
            check(nodes.stream().anyMatch(n -> n.id() == controller.id()), "controller %s not among nodes %s",
                    controller, nodes);
            List<Object> nodeList = new ArrayList<>();
            for (Node n : nodes) nodeList.add(map("id", n.id(), "host", n.host(), "port", n.port()));
            info(map("cluster_id", clusterId, "controller_id", controller.id(), "nodes", nodeList));
            ok("describeCluster cluster_id=%s controller=%d nodes=%d", clusterId, controller.id(), nodes.size());

            // createTopics with 3 partitions (and a topic config), then describeTopics.
            NewTopic nt = new NewTopic(topic, 3, (short) 1).configs(Map.of("cleanup.policy", "delete"));
            get(admin.createTopics(List.of(nt)).all());
            ok("createTopics %s partitions=3", topic);
            try {
                get(admin.createTopics(List.of(new NewTopic(topic, 3, (short) 1))).all());
                throw new Check("creating an existing topic succeeded");
            } catch (org.apache.kafka.common.errors.TopicExistsException e) {
                ok("createTopics existing -> TopicExistsException");
            }
            createTopicWait(admin, topic, 3);
            TopicDescription d = get(admin.describeTopics(List.of(topic)).allTopicNames()).get(topic);
            check(d.partitions().size() == 3, "describeTopics: %d partitions", d.partitions().size());
            check(!d.isInternal(), "topic is internal");
            check(d.topicId() != null && !d.topicId().equals(org.apache.kafka.common.Uuid.ZERO_UUID),
                    "describeTopics: no topic id");
            for (TopicPartitionInfo p : d.partitions()) {
                check(p.leader() != null && p.leader().id() == controller.id(), "partition %d leader %s",
                        p.partition(), p.leader());
                check(p.replicas().size() == 1 && p.isr().size() == 1, "partition %d replicas %s isr %s",
                        p.partition(), p.replicas(), p.isr());
            }
            info(map("topic", topic, "topic_id", d.topicId().toString(), "partitions", d.partitions().size()));
            ok("describeTopics %s partitions=3 topic_id=%s", topic, d.topicId());

            // describeConfigs / incrementalAlterConfigs on the topic.
            ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            Config cfg = get(admin.describeConfigs(List.of(res)).all()).get(res);
            ConfigEntry retention = cfg.get("retention.ms");
            check(retention != null, "describeConfigs: no retention.ms in %s", cfg.entries().size());
            ConfigEntry cleanup = cfg.get("cleanup.policy");
            check(cleanup != null && "delete".equals(cleanup.value()), "cleanup.policy %s", cleanup);
            ok("describeConfigs %s entries=%d retention.ms=%s", topic, cfg.entries().size(), retention.value());
            get(admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("retention.ms", "123456789"), AlterConfigOp.OpType.SET),
                    new AlterConfigOp(new ConfigEntry("max.message.bytes", "2000000"), AlterConfigOp.OpType.SET))))
                    .all());
            cfg = get(admin.describeConfigs(List.of(res)).all()).get(res);
            check("123456789".equals(cfg.get("retention.ms").value()), "retention.ms after SET: %s",
                    cfg.get("retention.ms"));
            check(cfg.get("retention.ms").source() == ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                    "retention.ms source after SET: %s", cfg.get("retention.ms").source());
            check("2000000".equals(cfg.get("max.message.bytes").value()), "max.message.bytes after SET: %s",
                    cfg.get("max.message.bytes"));
            ok("incrementalAlterConfigs SET retention.ms=123456789 max.message.bytes=2000000");
            get(admin.incrementalAlterConfigs(Map.of(res, List.of(
                    new AlterConfigOp(new ConfigEntry("max.message.bytes", ""), AlterConfigOp.OpType.DELETE))))
                    .all());
            cfg = get(admin.describeConfigs(List.of(res)).all()).get(res);
            check(cfg.get("max.message.bytes").source() != ConfigEntry.ConfigSource.DYNAMIC_TOPIC_CONFIG,
                    "max.message.bytes still a topic override after DELETE: %s", cfg.get("max.message.bytes"));
            check("123456789".equals(cfg.get("retention.ms").value()), "retention.ms lost after DELETE of another key");
            ok("incrementalAlterConfigs DELETE max.message.bytes -> %s", cfg.get("max.message.bytes").value());

            // createPartitions 3 -> 5.
            get(admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(5))).all());
            createTopicWait(admin, topic, 5);
            ok("createPartitions %s -> 5", topic);

            // Some records on partition 0, then deleteRecords before offset 4.
            try (KafkaProducer<byte[], byte[]> p = producer("none", false)) {
                for (int i = 0; i < 10; i++) {
                    get(p.send(new ProducerRecord<>(topic, 0, timestamp(i), key(topic, i), value(topic, i),
                            headers(topic, i))));
                }
            }
            TopicPartition tp0 = new TopicPartition(topic, 0);
            Map<TopicPartition, ListOffsetsResultInfo> lo = get(admin.listOffsets(Map.of(tp0, OffsetSpec.latest())).all());
            check(lo.get(tp0).offset() == 10, "listOffsets latest %d", lo.get(tp0).offset());
            DeletedRecords dr = get(admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(4))).lowWatermarks().get(tp0));
            check(dr.lowWatermark() == 4, "deleteRecords low watermark %d", dr.lowWatermark());
            lo = get(admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).all());
            check(lo.get(tp0).offset() == 4, "listOffsets earliest after deleteRecords %d", lo.get(tp0).offset());
            lo = get(admin.listOffsets(Map.of(tp0, OffsetSpec.maxTimestamp())).all());
            check(lo.get(tp0).offset() == 9 && lo.get(tp0).timestamp() == timestamp(9),
                    "listOffsets maxTimestamp offset=%d ts=%d", lo.get(tp0).offset(), lo.get(tp0).timestamp());
            lo = get(admin.listOffsets(Map.of(tp0, OffsetSpec.forTimestamp(timestamp(6)))).all());
            check(lo.get(tp0).offset() == 6, "listOffsets forTimestamp offset=%d", lo.get(tp0).offset());
            ok("deleteRecords %s-0 before 4 -> low watermark 4; listOffsets earliest/latest/maxTimestamp/forTimestamp",
                    topic);
            try (KafkaConsumer<byte[], byte[]> c = consumer(Map.of())) {
                c.assign(List.of(tp0));
                c.seekToBeginning(List.of(tp0));
                List<ConsumerRecord<byte[], byte[]>> got = pollN(c, 6);
                check(got.get(0).offset() == 4, "first offset after deleteRecords %d", got.get(0).offset());
                ok("consume after deleteRecords starts at 4");
            }

            // listTopics, deleteTopics, listTopics.
            Set<String> names = get(admin.listTopics().names());
            check(names.contains(topic), "listTopics %s lacks %s", names, topic);
            check(!names.contains("__consumer_offsets"), "listTopics lists internal topics by default");
            ok("listTopics contains %s (%d topics)", topic, names.size());
            get(admin.deleteTopics(List.of(topic)).all());
            long deadline = System.currentTimeMillis() + DEADLINE_MS;
            while (get(admin.listTopics().names()).contains(topic)) {
                check(System.currentTimeMillis() < deadline, "topic %s still listed after deleteTopics", topic);
                Thread.sleep(50);
            }
            ok("deleteTopics %s; listTopics no longer has it", topic);
            try {
                get(admin.describeTopics(List.of(topic)).allTopicNames());
                throw new Check("describeTopics of a deleted topic succeeded");
            } catch (org.apache.kafka.common.errors.UnknownTopicOrPartitionException e) {
                ok("describeTopics deleted -> UnknownTopicOrPartitionException");
            }
        }
    }

    void createTopicWait(Admin admin, String topic, int partitions) throws Exception {
        long deadline = System.currentTimeMillis() + DEADLINE_MS;
        while (true) {
            try {
                TopicDescription d = get(admin.describeTopics(List.of(topic)).allTopicNames()).get(topic);
                if (d.partitions().size() == partitions
                        && d.partitions().stream().allMatch(p -> p.leader() != null && !p.leader().isEmpty())) {
                    return;
                }
            } catch (org.apache.kafka.common.errors.UnknownTopicOrPartitionException e) {
                // not yet visible
            }
            check(System.currentTimeMillis() < deadline, "topic %s: no %d partitions with leaders", topic, partitions);
            Thread.sleep(50);
        }
    }

    // ------------------------------------------------------------------ scenario: produce

    KafkaProducer<byte[], byte[]> producer(String compression, Boolean idempotence) {
        Properties p = common();
        p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, compression);
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.put(ProducerConfig.DELIVERY_TIMEOUT_MS_CONFIG, "60000");
        // idempotence null: leave the client's default (true since Kafka 3.0).
        if (idempotence != null) p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, idempotence.toString());
        return new KafkaProducer<>(p);
    }

    void produce() throws Exception {
        String topic = arg("topic");
        String tag = tag();
        String compression = arg("compression", "none");
        String idem = arg("idempotence", "false");
        Boolean idempotence = "default".equals(idem) ? null : Boolean.valueOf(idem);
        int n = count();
        int partitions = Integer.parseInt(arg("partitions", "3"));
        if (!"false".equals(arg("create", "true"))) {
            try (Admin admin = newAdmin()) {
                createTopic(admin, topic, partitions);
            }
        }
        List<Future<RecordMetadata>> futures = new ArrayList<>(n);
        long t0 = System.nanoTime();
        try (KafkaProducer<byte[], byte[]> p = producer(compression, idempotence)) {
            for (int i = 0; i < n; i++) {
                futures.add(p.send(new ProducerRecord<>(topic, null, timestamp(i), key(tag, i), value(tag, i),
                        headers(tag, i))));
            }
            p.flush();
            Map<Integer, Set<Long>> offsets = new TreeMap<>();
            Map<Integer, Long> lastOffset = new HashMap<>();
            for (int i = 0; i < n; i++) {
                RecordMetadata md = get(futures.get(i));
                check(md.hasOffset(), "record %d: no offset in RecordMetadata", i);
                check(md.timestamp() == timestamp(i), "record %d: RecordMetadata timestamp %d, sent %d", i,
                        md.timestamp(), timestamp(i));
                check(offsets.computeIfAbsent(md.partition(), k -> new HashSet<>()).add(md.offset()),
                        "record %d: offset %d on partition %d given twice", i, md.offset(), md.partition());
                Long last = lastOffset.put(md.partition(), md.offset());
                check(last == null || md.offset() > last, "record %d: offset %d after %d on partition %d", i,
                        md.offset(), last, md.partition());
            }
            Map<String, Object> counts = new TreeMap<>();
            for (Map.Entry<Integer, Set<Long>> e : offsets.entrySet()) {
                long max = Collections.max(e.getValue());
                // A fresh topic: offsets on each partition are exactly 0..count-1.
                check(max == e.getValue().size() - 1, "partition %d: offsets not contiguous (max %d, %d records)",
                        e.getKey(), max, e.getValue().size());
                counts.put(e.getKey().toString(), e.getValue().size());
            }
            double secs = (System.nanoTime() - t0) / 1e9;
            info(map("produced", n, "compression", compression, "idempotence", idem, "per_partition", counts,
                    "seconds", Math.round(secs * 1000) / 1000.0));
            ok("produced %d compression=%s idempotence=%s", n, compression, idem);
        }
    }

    // ------------------------------------------------------------------ scenario: consume

    List<ConsumerRecord<byte[], byte[]>> pollN(KafkaConsumer<byte[], byte[]> c, int n) {
        List<ConsumerRecord<byte[], byte[]>> out = new ArrayList<>(n);
        long deadline = System.currentTimeMillis() + DEADLINE_MS;
        while (out.size() < n) {
            check(System.currentTimeMillis() < deadline, "timed out: %d of %d records after %d ms", out.size(), n,
                    DEADLINE_MS);
            for (ConsumerRecord<byte[], byte[]> r : c.poll(POLL)) out.add(r);
        }
        return out;
    }

    /** Checks one record against the generator; returns its index. */
    static int verify(String tag, ConsumerRecord<byte[], byte[]> r) {
        int i = indexOf(tag, r.key());
        String where = r.topic() + "-" + r.partition() + "@" + r.offset() + " (record " + i + ")";
        check(Arrays.equals(r.value(), value(tag, i)), "%s: value %s, want %s", where, show(r.value()),
                show(value(tag, i)));
        check(r.timestamp() == timestamp(i), "%s: timestamp %d, want %d", where, r.timestamp(), timestamp(i));
        check(r.timestampType() == TimestampType.CREATE_TIME, "%s: timestamp type %s", where, r.timestampType());
        List<Header> want = headers(tag, i);
        List<Header> got = new ArrayList<>();
        r.headers().forEach(got::add);
        boolean same = got.size() == want.size();
        for (int j = 0; same && j < got.size(); j++) {
            same = got.get(j).key().equals(want.get(j).key()) && Arrays.equals(got.get(j).value(), want.get(j).value());
        }
        check(same, "%s: headers %s, want %s", where, showHeaders(got), showHeaders(want));
        return i;
    }

    void consume() throws Exception {
        String topic = arg("topic");
        String tag = tag();
        int n = count();
        String isolation = arg("isolation", "read_uncommitted");
        try (KafkaConsumer<byte[], byte[]> c = consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation,
                ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "2000"))) {
            List<TopicPartition> tps = c.partitionsFor(topic).stream()
                    .map(p -> new TopicPartition(topic, p.partition())).sorted(
                            (x, y) -> Integer.compare(x.partition(), y.partition())).collect(Collectors.toList());
            c.assign(tps);
            c.seekToBeginning(tps);
            List<ConsumerRecord<byte[], byte[]>> recs = pollN(c, n);
            // Nothing beyond n.
            ConsumerRecords<byte[], byte[]> extra = c.poll(Duration.ofMillis(300));
            check(extra.isEmpty(), "%d records beyond the expected %d", extra.count(), n);

            boolean[] seen = new boolean[n];
            Map<TopicPartition, Long> lastOffset = new HashMap<>();
            Map<TopicPartition, Integer> lastIndex = new HashMap<>();
            Map<TopicPartition, List<ConsumerRecord<byte[], byte[]>>> byTp = new HashMap<>();
            for (ConsumerRecord<byte[], byte[]> r : recs) {
                int i = verify(tag, r);
                check(i < n && !seen[i], "record %d read twice or out of range", i);
                seen[i] = true;
                TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                Long lo = lastOffset.put(tp, r.offset());
                check(lo == null ? r.offset() == 0 : r.offset() == lo + 1, "%s: offset %d after %s", tp, r.offset(), lo);
                Integer li = lastIndex.put(tp, i);
                check(li == null || i > li, "%s: record %d after record %d (produce order lost)", tp, i, li);
                byTp.computeIfAbsent(tp, k -> new ArrayList<>()).add(r);
            }
            ok("consumed %d identical records in order (isolation=%s, %d partitions)", n, isolation, byTp.size());

            // beginningOffsets / endOffsets.
            Map<TopicPartition, Long> begin = c.beginningOffsets(tps);
            Map<TopicPartition, Long> end = c.endOffsets(tps);
            Map<String, Object> ends = new TreeMap<>();
            for (TopicPartition tp : tps) {
                int cnt = byTp.getOrDefault(tp, List.of()).size();
                check(begin.get(tp) == 0, "%s: beginningOffset %d", tp, begin.get(tp));
                check(end.get(tp) == cnt, "%s: endOffset %d, read %d records", tp, end.get(tp), cnt);
                check(c.position(tp) == cnt, "%s: position %d, read %d records", tp, c.position(tp), cnt);
                ends.put(Integer.toString(tp.partition()), end.get(tp));
            }
            info(map("end_offsets", ends));
            ok("beginningOffsets all 0, endOffsets = records per partition");

            // offsetsForTimes: a middle record's timestamp (and 1 ms before it) -> its offset; 0 -> 0; past the end -> null.
            Map<TopicPartition, Long> query = new HashMap<>();
            Map<TopicPartition, Long> queryBefore = new HashMap<>();
            Map<TopicPartition, Long> queryZero = new HashMap<>();
            Map<TopicPartition, Long> queryAfter = new HashMap<>();
            Map<TopicPartition, ConsumerRecord<byte[], byte[]>> mid = new HashMap<>();
            for (Map.Entry<TopicPartition, List<ConsumerRecord<byte[], byte[]>>> e : byTp.entrySet()) {
                ConsumerRecord<byte[], byte[]> m = e.getValue().get(e.getValue().size() / 2);
                mid.put(e.getKey(), m);
                query.put(e.getKey(), m.timestamp());
                queryBefore.put(e.getKey(), m.timestamp() - 1);
                queryZero.put(e.getKey(), 0L);
                queryAfter.put(e.getKey(), timestamp(n) + 1_000_000);
            }
            Map<TopicPartition, OffsetAndTimestamp> at = c.offsetsForTimes(query);
            Map<TopicPartition, OffsetAndTimestamp> before = c.offsetsForTimes(queryBefore);
            Map<TopicPartition, OffsetAndTimestamp> zero = c.offsetsForTimes(queryZero);
            Map<TopicPartition, OffsetAndTimestamp> after = c.offsetsForTimes(queryAfter);
            for (TopicPartition tp : byTp.keySet()) {
                ConsumerRecord<byte[], byte[]> m = mid.get(tp);
                check(at.get(tp) != null && at.get(tp).offset() == m.offset() && at.get(tp).timestamp() == m.timestamp(),
                        "%s: offsetsForTimes(%d) = %s, want offset %d", tp, m.timestamp(), at.get(tp), m.offset());
                check(before.get(tp) != null && before.get(tp).offset() == m.offset(),
                        "%s: offsetsForTimes(%d) = %s, want offset %d", tp, m.timestamp() - 1, before.get(tp), m.offset());
                check(zero.get(tp) != null && zero.get(tp).offset() == 0, "%s: offsetsForTimes(0) = %s", tp, zero.get(tp));
                check(after.get(tp) == null, "%s: offsetsForTimes(after the end) = %s, want null", tp, after.get(tp));
            }
            ok("offsetsForTimes exact/before/zero/after on %d partitions", byTp.size());
        }
    }

    // ------------------------------------------------------------------ scenario: sessions

    /**
     * Incremental fetch sessions (KIP-227): one consumer assigned every partition of a topic with many partitions
     * (arg partitions, default 100) reads while a producer thread is still writing, and must see each of the count
     * records exactly once, record i on partition i % partitions at offset i / partitions.
     */
    void sessions() throws Exception {
        String topic = arg("topic");
        String tag = tag();
        int n = count();
        int partitions = Integer.parseInt(arg("partitions", "100"));
        try (Admin admin = newAdmin()) {
            createTopic(admin, topic, partitions);
        }
        AtomicReference<Throwable> producerFailed = new AtomicReference<>();
        Thread producing = new Thread(() -> {
            try (KafkaProducer<byte[], byte[]> p = producer("none", null)) {
                for (int i = 0; i < n; i++) {
                    p.send(new ProducerRecord<>(topic, i % partitions, timestamp(i), key(tag, i), value(tag, i),
                            headers(tag, i)), (md, e) -> {
                                if (e != null) producerFailed.compareAndSet(null, e);
                            });
                    // In steps, so that the consumer's fetches meet partitions with and without new data.
                    if (i % 1000 == 999) {
                        p.flush();
                        Thread.sleep(30);
                    }
                }
                p.flush();
            } catch (Throwable t) {
                producerFailed.compareAndSet(null, t);
            }
        }, "sessions-producer");
        try (KafkaConsumer<byte[], byte[]> c = consumer(Map.of(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "1000"))) {
            List<TopicPartition> tps = new ArrayList<>();
            for (int p = 0; p < partitions; p++) tps.add(new TopicPartition(topic, p));
            c.assign(tps);
            c.seekToBeginning(tps);
            producing.start();
            boolean[] seen = new boolean[n];
            Map<Integer, Integer> perPartition = new TreeMap<>();
            int got = 0;
            int polls = 0;
            long deadline = System.currentTimeMillis() + 2 * DEADLINE_MS;
            while (got < n) {
                check(producerFailed.get() == null, "producer failed: %s", producerFailed.get());
                check(System.currentTimeMillis() < deadline, "timed out: %d of %d records", got, n);
                for (ConsumerRecord<byte[], byte[]> r : c.poll(POLL)) {
                    int i = verify(tag, r);
                    check(i < n && !seen[i], "record %d read twice or out of range", i);
                    seen[i] = true;
                    check(r.partition() == i % partitions && r.offset() == i / partitions,
                            "record %d at %d@%d, want %d@%d", i, r.partition(), r.offset(), i % partitions,
                            i / partitions);
                    perPartition.merge(r.partition(), 1, Integer::sum);
                    got++;
                }
                polls++;
            }
            producing.join(60_000);
            check(!producing.isAlive() && producerFailed.get() == null, "producer did not finish: %s",
                    producerFailed.get());
            ConsumerRecords<byte[], byte[]> extra = c.poll(Duration.ofMillis(500));
            check(extra.isEmpty(), "%d records beyond the expected %d", extra.count(), n);
            info(map("sessions_consumed", n, "partitions", perPartition.size(), "polls", polls));
            ok("consumed %d records exactly once from %d partitions while producing", n, perPartition.size());
        }
    }

    // ------------------------------------------------------------------ scenario: group

    void group() throws Exception {
        String topic = arg("topic");
        String tag = tag();
        String group = arg("group");
        int n = count();
        Map<String, String> conf = Map.of(ConsumerConfig.GROUP_ID_CONFIG, group,
                ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "100",
                ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000",
                ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "1000");
        boolean[] seen = new boolean[n];
        int first = 0;
        Map<TopicPartition, Long> committed = new HashMap<>();
        Map<TopicPartition, Long> lastOffset = new HashMap<>();
        try (KafkaConsumer<byte[], byte[]> c1 = consumer(conf)) {
            c1.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + DEADLINE_MS;
            while (first < n / 2) {
                check(System.currentTimeMillis() < deadline, "first consumer: %d records after %d ms", first, DEADLINE_MS);
                for (ConsumerRecord<byte[], byte[]> r : c1.poll(POLL)) {
                    int i = verify(tag, r);
                    check(!seen[i], "first consumer read record %d twice", i);
                    seen[i] = true;
                    first++;
                    lastOffset.put(new TopicPartition(r.topic(), r.partition()), r.offset());
                }
            }
            Set<TopicPartition> assignment = c1.assignment();
            check(assignment.size() == c1.partitionsFor(topic).size(), "first consumer assigned %s", assignment);
            c1.commitSync();
            Map<TopicPartition, OffsetAndMetadata> cm = c1.committed(assignment);
            for (TopicPartition tp : assignment) {
                long want = lastOffset.containsKey(tp) ? lastOffset.get(tp) + 1 : -1;
                OffsetAndMetadata om = cm.get(tp);
                if (want < 0) {
                    // commitSync commits the position: a partition not yet read is committed at its fetch position.
                    check(om == null || om.offset() == c1.position(tp), "%s: committed %s", tp, om);
                } else {
                    check(om != null && om.offset() == want, "%s: committed %s, want %d", tp, om, want);
                }
                if (om != null) committed.put(tp, om.offset());
            }
            info(map("group", group, "first_consumer_read", first, "committed",
                    committed.entrySet().stream().collect(Collectors.toMap(e -> Integer.toString(e.getKey().partition()),
                            Map.Entry::getValue, (x, y) -> x, TreeMap::new))));
            ok("first consumer in group %s read %d, committed %s", group, first, committed);
        }
        int second = 0;
        Map<TopicPartition, Long> firstSeen = new HashMap<>();
        try (KafkaConsumer<byte[], byte[]> c2 = consumer(conf)) {
            c2.subscribe(List.of(topic));
            long deadline = System.currentTimeMillis() + DEADLINE_MS;
            while (first + second < n) {
                check(System.currentTimeMillis() < deadline, "second consumer: %d of %d records after %d ms", second,
                        n - first, DEADLINE_MS);
                for (ConsumerRecord<byte[], byte[]> r : c2.poll(POLL)) {
                    int i = verify(tag, r);
                    check(!seen[i], "record %d (%s-%d@%d) read again by the second consumer (committed %s)", i,
                            r.topic(), r.partition(), r.offset(), committed);
                    seen[i] = true;
                    second++;
                    firstSeen.putIfAbsent(new TopicPartition(r.topic(), r.partition()), r.offset());
                }
            }
            for (Map.Entry<TopicPartition, Long> e : firstSeen.entrySet()) {
                long want = committed.getOrDefault(e.getKey(), 0L);
                check(e.getValue() == want, "%s: second consumer started at %d, committed %d", e.getKey(),
                        e.getValue(), want);
            }
            ConsumerRecords<byte[], byte[]> extra = c2.poll(Duration.ofMillis(300));
            check(extra.isEmpty(), "second consumer got %d records beyond the end", extra.count());
            c2.commitSync();
            Map<TopicPartition, Long> end = c2.endOffsets(c2.assignment());
            Map<TopicPartition, OffsetAndMetadata> cm = c2.committed(c2.assignment());
            for (TopicPartition tp : c2.assignment()) {
                check(cm.get(tp) != null && cm.get(tp).offset() == end.get(tp), "%s: final committed %s, end %d", tp,
                        cm.get(tp), end.get(tp));
            }
            ok("second consumer resumed after the committed offsets and read the remaining %d", second);
        }
    }

    // ------------------------------------------------------------------ scenario: rebalance

    /** One member of a group, polled by its own thread; publishes what it read and its assignment. */
    final class Member implements Runnable {
        final String name;
        final Map<String, String> conf;
        final String topic;
        final String tag;
        final boolean[] seen;
        final int[] total;
        volatile Set<Integer> assignment = Set.of();
        volatile boolean stop;
        volatile Throwable error;
        volatile int read;
        volatile int rebalances;

        Member(String name, Map<String, String> conf, String topic, String tag, boolean[] seen, int[] total) {
            this.name = name;
            this.conf = conf;
            this.topic = topic;
            this.tag = tag;
            this.seen = seen;
            this.total = total;
        }

        @Override
        public void run() {
            try (KafkaConsumer<byte[], byte[]> c = consumer(conf)) {
                c.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> parts) {
                        // Everything returned by poll() has been processed: commit it before giving partitions up.
                        if (!parts.isEmpty()) c.commitSync();
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> parts) {
                        rebalances++;
                    }
                });
                while (!stop) {
                    for (ConsumerRecord<byte[], byte[]> r : c.poll(POLL)) {
                        int i = verify(tag, r);
                        synchronized (seen) {
                            check(!seen[i], "%s: record %d (%s-%d@%d) read twice in the group", name, i, r.topic(),
                                    r.partition(), r.offset());
                            seen[i] = true;
                            total[0]++;
                        }
                        read++;
                    }
                    assignment = c.assignment().stream().map(TopicPartition::partition).collect(Collectors.toSet());
                }
                c.commitSync();
            } catch (Throwable t) {
                error = t;
            }
        }
    }

    void rebalance() throws Exception {
        String topic = arg("topic");
        String tag = tag();
        String group = arg("group");
        int n = count();
        Map<String, String> conf = Map.of(ConsumerConfig.GROUP_ID_CONFIG, group,
                ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "50",
                ConsumerConfig.SESSION_TIMEOUT_MS_CONFIG, "10000",
                ConsumerConfig.HEARTBEAT_INTERVAL_MS_CONFIG, "500");
        boolean[] seen = new boolean[n];
        int[] total = {0};
        Member m1 = new Member("consumer-1", conf, topic, tag, seen, total);
        Member m2 = new Member("consumer-2", conf, topic, tag, seen, total);
        Thread t1 = new Thread(m1, "member-1");
        Thread t2 = new Thread(m2, "member-2");
        t1.start();
        t2.start();
        int partitions;
        try (Admin admin = newAdmin()) {
            partitions = get(admin.describeTopics(List.of(topic)).allTopicNames()).get(topic).partitions().size();
        }
        Set<Integer> all = new HashSet<>();
        for (int p = 0; p < partitions; p++) all.add(p);
        long deadline = System.currentTimeMillis() + DEADLINE_MS;
        try {
            // Both members share the partitions, disjointly, and together read every record exactly once.
            while (true) {
                check(m1.error == null && m2.error == null, "member failed: %s",
                        m1.error != null ? m1.error : m2.error);
                Set<Integer> a1 = m1.assignment, a2 = m2.assignment;
                Set<Integer> union = new HashSet<>(a1);
                union.addAll(a2);
                int got;
                synchronized (seen) {
                    got = total[0];
                }
                if (!a1.isEmpty() && !a2.isEmpty() && union.equals(all) && a1.size() + a2.size() == partitions
                        && got == n) {
                    ok("two members share %d partitions %s / %s and read %d records once (%d + %d)", partitions,
                            new TreeSet<>(a1), new TreeSet<>(a2), n, m1.read, m2.read);
                    break;
                }
                check(System.currentTimeMillis() < deadline,
                        "timed out: assignments %s / %s, %d of %d records read", a1, a2, got, n);
                Thread.sleep(50);
            }
            // The second member leaves: the first one takes every partition over.
            m2.stop = true;
            t2.join(DEADLINE_MS);
            check(!t2.isAlive() && m2.error == null, "second member did not close cleanly: %s", m2.error);
            while (!m1.assignment.equals(all)) {
                check(m1.error == null, "first member failed: %s", m1.error);
                check(System.currentTimeMillis() < deadline, "after the second member left: first member has %s",
                        m1.assignment);
                Thread.sleep(50);
            }
            Thread.sleep(300);
            synchronized (seen) {
                check(total[0] == n, "%d records read after the rebalance, want %d", total[0], n);
            }
            ok("after the second member left the first holds all %d partitions (%d rebalances); no record re-read",
                    partitions, m1.rebalances);
        } finally {
            m1.stop = true;
            m2.stop = true;
            t1.join(DEADLINE_MS);
            t2.join(DEADLINE_MS);
        }
        check(m1.error == null, "first member failed: %s", m1.error);
    }
}
