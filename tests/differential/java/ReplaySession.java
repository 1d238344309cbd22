import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Collections;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.InvalidConfigurationException;
import org.apache.kafka.common.errors.TopicExistsException;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java client's sessions recorded by tests/differential/replay.py:
 * {@code ReplaySession <bootstrap> <scenario> <tag>}.
 *
 * <p>Scenarios: {@code idempotent} (20 records, acks=all, idempotence), {@code group} (a consumer group reads them
 * and commits synchronously), {@code transaction} (a committed transaction with sendOffsetsToTransaction, then an
 * aborted one), {@code admin} (describeCluster, createTopics with configs, an existing and an invalid topic,
 * describeTopics, describeConfigs, incrementalAlterConfigs, listTopics, deleteTopics). Prints {@code DONE <scenario>}
 * at the end; a failure prints {@code FAIL} and exits 1.
 */
public final class ReplaySession {
    static final int RECORDS = 20;

    final String bootstrap;
    final String tag;

    ReplaySession(String bootstrap, String tag) {
        this.bootstrap = bootstrap;
        this.tag = tag;
    }

    public static void main(String[] argv) {
        ReplaySession s = new ReplaySession(argv[0], argv[2]);
        String scenario = argv[1];
        try {
            switch (scenario) {
                case "idempotent": s.idempotent(); break;
                case "group": s.group(); break;
                case "transaction": s.transaction(); break;
                case "admin": s.admin(); break;
                default: throw new IllegalStateException("unknown scenario " + scenario);
            }
        } catch (Throwable e) {
            System.out.println("FAIL " + scenario + ": " + e);
            e.printStackTrace(System.out);
            System.out.flush();
            System.exit(1);
        }
        System.out.println("DONE " + scenario);
        System.out.flush();
        System.exit(0);
    }

    KafkaProducer<byte[], byte[]> producer(String clientId, Map<String, Object> extra) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put(ProducerConfig.CLIENT_ID_CONFIG, clientId);
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        p.put(ProducerConfig.LINGER_MS_CONFIG, "5");
        p.putAll(extra);
        return new KafkaProducer<>(p, new ByteArraySerializer(), new ByteArraySerializer());
    }

    void idempotent() throws Exception {
        String topic = "replay-java-" + tag;
        try (KafkaProducer<byte[], byte[]> p = producer("replay-java-producer", Collections.emptyMap())) {
            List<Future<RecordMetadata>> sent = new ArrayList<>();
            for (int i = 0; i < RECORDS; i++) {
                sent.add(p.send(new ProducerRecord<>(topic, ("k" + i % 3).getBytes(UTF_8), ("v" + i).getBytes(UTF_8))));
            }
            p.flush();
            for (Future<RecordMetadata> f : sent) {
                f.get();
            }
        }
    }

    void group() {
        Properties c = new Properties();
        c.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        c.put(ConsumerConfig.CLIENT_ID_CONFIG, "replay-java-consumer");
        c.put(ConsumerConfig.GROUP_ID_CONFIG, "replay-java-group-" + tag);
        c.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        c.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        int seen = 0;
        try (KafkaConsumer<byte[], byte[]> consumer =
                 new KafkaConsumer<>(c, new ByteArrayDeserializer(), new ByteArrayDeserializer())) {
            consumer.subscribe(Collections.singletonList("replay-java-" + tag));
            long deadline = System.currentTimeMillis() + 60_000;
            while (seen < RECORDS && System.currentTimeMillis() < deadline) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                seen += records.count();
            }
            consumer.commitSync();
        }
        if (seen != RECORDS) {
            throw new IllegalStateException("the group consumed " + seen + " of " + RECORDS + " records");
        }
    }

    void transaction() throws Exception {
        String topic = "replay-java-txn-" + tag;
        Map<String, Object> extra = new HashMap<>();
        extra.put(ProducerConfig.TRANSACTIONAL_ID_CONFIG, "replay-java-txn-" + tag);
        try (KafkaProducer<byte[], byte[]> p = producer("replay-java-txn", extra)) {
            p.initTransactions();
            p.beginTransaction();
            for (int i = 0; i < 5; i++) {
                p.send(new ProducerRecord<>(topic, ("t" + i).getBytes(UTF_8)));
            }
            p.sendOffsetsToTransaction(
                Collections.singletonMap(new TopicPartition(topic, 0), new OffsetAndMetadata(5)),
                new ConsumerGroupMetadata("replay-java-txn-group-" + tag));
            p.commitTransaction();
            p.beginTransaction();
            for (int i = 0; i < 2; i++) {
                p.send(new ProducerRecord<>(topic, ("a" + i).getBytes(UTF_8)));
            }
            p.flush();
            p.abortTransaction();
        }
    }

    static void expect(Future<?> f, Class<? extends Throwable> error) throws Exception {
        try {
            f.get();
        } catch (ExecutionException e) {
            if (error.isInstance(e.getCause())) {
                return;
            }
            throw e;
        }
        throw new IllegalStateException("expected " + error.getSimpleName());
    }

    void admin() throws Exception {
        String topic = "replay-java-admin-" + tag;
        Properties a = new Properties();
        a.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        a.put(AdminClientConfig.CLIENT_ID_CONFIG, "replay-java-admin");
        try (Admin admin = Admin.create(a)) {
            DescribeClusterResult cluster = admin.describeCluster();
            if (cluster.nodes().get().size() != 1) {
                throw new IllegalStateException("one broker expected: " + cluster.nodes().get());
            }
            cluster.clusterId().get();
            Map<String, String> configs = new HashMap<>();
            configs.put("cleanup.policy", "compact");
            configs.put("retention.ms", "3600000");
            NewTopic created = new NewTopic(topic, 3, (short) 1).configs(configs);
            admin.createTopics(Collections.singletonList(created)).all().get();
            expect(admin.createTopics(Collections.singletonList(new NewTopic(topic, 3, (short) 1))).all(),
                TopicExistsException.class);
            NewTopic invalid = new NewTopic(topic + "-invalid", 1, (short) 1)
                .configs(Collections.singletonMap("cleanup.policy", "bogus"));
            expect(admin.createTopics(Collections.singletonList(invalid)).all(), InvalidConfigurationException.class);
            Map<String, TopicDescription> described = admin.describeTopics(Collections.singletonList(topic))
                .allTopicNames().get();
            if (described.get(topic).partitions().size() != 3) {
                throw new IllegalStateException("3 partitions expected: " + described);
            }
            ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
            Config before = admin.describeConfigs(Collections.singletonList(resource)).all().get().get(resource);
            if (!"compact".equals(before.get("cleanup.policy").value())) {
                throw new IllegalStateException("cleanup.policy: " + before.get("cleanup.policy"));
            }
            Collection<AlterConfigOp> ops = List.of(
                new AlterConfigOp(new ConfigEntry("retention.ms", "7200000"), AlterConfigOp.OpType.SET),
                new AlterConfigOp(new ConfigEntry("cleanup.policy", ""), AlterConfigOp.OpType.DELETE));
            admin.incrementalAlterConfigs(Collections.singletonMap(resource, ops)).all().get();
            Config after = admin.describeConfigs(Collections.singletonList(resource)).all().get().get(resource);
            if (!"7200000".equals(after.get("retention.ms").value())) {
                throw new IllegalStateException("retention.ms: " + after.get("retention.ms"));
            }
            if (!admin.listTopics().names().get().contains(topic)) {
                throw new IllegalStateException("listTopics misses " + topic);
            }
            admin.deleteTopics(Collections.singletonList(topic)).all().get();
            expect(admin.describeTopics(Collections.singletonList(topic)).allTopicNames(),
                UnknownTopicOrPartitionException.class);
        }
    }
}
