import static java.nio.charset.StandardCharsets.UTF_8;

import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.Collections;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.acl.AccessControlEntry;
import org.apache.kafka.common.acl.AccessControlEntryFilter;
import org.apache.kafka.common.acl.AclBinding;
import org.apache.kafka.common.acl.AclBindingFilter;
import org.apache.kafka.common.acl.AclOperation;
import org.apache.kafka.common.acl.AclPermissionType;
import org.apache.kafka.common.errors.ClusterAuthorizationException;
import org.apache.kafka.common.errors.TopicAuthorizationException;
import org.apache.kafka.common.resource.PatternType;
import org.apache.kafka.common.resource.ResourcePattern;
import org.apache.kafka.common.resource.ResourcePatternFilter;
import org.apache.kafka.common.resource.ResourceType;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * The Java Admin's ACL APIs and the authorization a Java producer and consumer meet, against a broker with
 * SASL PLAIN users: {@code AclCompat <sasl-bootstrap> <topic> <group>}.
 *
 * <p>As {@code admin} (a super user) it creates a prefixed Read ACL on the topic's prefix and a Read ACL on the
 * group for {@code alice}, lists and filters them; as {@code alice} it sees its authorized operations, consumes
 * and is refused a produce and an ACL change; then {@code admin} deletes the ACLs and alice loses access.
 * Prints {@code OK <check>} lines and finally {@code DONE}; any failure prints {@code FAIL} and exits 1.
 */
public final class AclCompat {
    static Properties as(String bootstrap, String user) {
        Properties p = new Properties();
        p.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        p.put("security.protocol", "SASL_PLAINTEXT");
        p.put("sasl.mechanism", "PLAIN");
        p.put("sasl.jaas.config", "org.apache.kafka.common.security.plain.PlainLoginModule required username=\""
                + user + "\" password=\"" + user + "-secret\";");
        p.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "15000");
        p.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "30000");
        return p;
    }

    static void ok(String what) {
        System.out.println("OK " + what);
    }

    static void check(boolean cond, String what) {
        if (!cond) {
            throw new AssertionError(what);
        }
        ok(what);
    }

    static <T extends Throwable> T cause(ExecutionException e, Class<T> type) {
        Throwable c = e.getCause();
        if (!type.isInstance(c)) {
            throw new AssertionError("expected " + type.getSimpleName() + ", got " + c, c);
        }
        return type.cast(c);
    }

    public static void main(String[] argv) throws Exception {
        String bootstrap = argv[0];
        String topic = argv[1];
        String group = argv[2];
        String prefix = topic.substring(0, topic.indexOf('-') + 1);
        try {
            run(bootstrap, topic, group, prefix);
        } catch (Throwable t) {
            System.out.println("FAIL " + t);
            t.printStackTrace();
            System.exit(1);
        }
        System.out.println("DONE");
    }

    static void run(String bootstrap, String topic, String group, String prefix) throws Exception {
        AclBinding read = new AclBinding(new ResourcePattern(ResourceType.TOPIC, prefix, PatternType.PREFIXED),
                new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW));
        AclBinding join = new AclBinding(new ResourcePattern(ResourceType.GROUP, group, PatternType.LITERAL),
                new AccessControlEntry("User:alice", "*", AclOperation.READ, AclPermissionType.ALLOW));
        try (Admin admin = Admin.create(as(bootstrap, "admin"))) {
            admin.createAcls(Arrays.asList(read, join)).all().get();
            ok("createAcls");
            Collection<AclBinding> all = admin.describeAcls(AclBindingFilter.ANY).values().get();
            check(all.containsAll(Arrays.asList(read, join)), "describeAcls ANY " + all.size());
            AclBindingFilter match = new AclBindingFilter(
                    new ResourcePatternFilter(ResourceType.TOPIC, topic, PatternType.MATCH), AccessControlEntryFilter.ANY);
            Collection<AclBinding> matching = admin.describeAcls(match).values().get();
            check(matching.equals(Collections.singletonList(read)), "describeAcls MATCH " + topic);
        }
        try (Admin alice = Admin.create(as(bootstrap, "alice"))) {
            TopicDescription d = alice.describeTopics(Collections.singleton(topic),
                    new DescribeTopicsOptions().includeAuthorizedOperations(true)).allTopicNames().get().get(topic);
            Set<AclOperation> ops = d.authorizedOperations();
            check(ops.equals(new TreeSet<>(Arrays.asList(AclOperation.READ, AclOperation.DESCRIBE))),
                    "authorizedOperations " + ops);
            try {
                alice.createAcls(Collections.singleton(read)).all().get();
                throw new AssertionError("alice may not create ACLs");
            } catch (ExecutionException e) {
                cause(e, ClusterAuthorizationException.class);
                ok("createAcls refused ClusterAuthorizationException");
            }
        }
        Properties cp = as(bootstrap, "alice");
        cp.put(ConsumerConfig.GROUP_ID_CONFIG, group);
        cp.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        List<String> got = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(cp)) {
            c.subscribe(Collections.singleton(topic));
            long deadline = System.currentTimeMillis() + 30_000;
            while (got.size() < 3 && System.currentTimeMillis() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(200))) {
                    got.add(new String(r.value(), UTF_8));
                }
            }
            c.commitSync();
        }
        check(got.size() == 3, "consume as alice " + got);
        Properties pp = as(bootstrap, "alice");
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "false");
        pp.put(ProducerConfig.MAX_BLOCK_MS_CONFIG, "15000");
        try (KafkaProducer<byte[], byte[]> p = new KafkaProducer<>(pp)) {
            p.send(new ProducerRecord<>(topic, "nope".getBytes(UTF_8))).get();
            throw new AssertionError("alice may not produce");
        } catch (ExecutionException e) {
            cause(e, TopicAuthorizationException.class);
            ok("produce refused TopicAuthorizationException");
        }
        try (Admin admin = Admin.create(as(bootstrap, "admin"))) {
            Collection<AclBinding> deleted = admin.deleteAcls(Collections.singleton(new AclBindingFilter(
                    new ResourcePatternFilter(ResourceType.ANY, null, PatternType.ANY),
                    new AccessControlEntryFilter("User:alice", null, AclOperation.ANY, AclPermissionType.ANY))))
                    .all().get();
            check(new TreeSet<>(deleted.stream().map(Object::toString).collect(Collectors.toList()))
                    .equals(new TreeSet<>(Arrays.asList(read.toString(), join.toString()))), "deleteAcls");
        }
        try (Admin alice = Admin.create(as(bootstrap, "alice"))) {
            Set<String> names = alice.listTopics().names().get();
            check(!names.contains(topic), "topic hidden after deleteAcls " + names);
        }
    }
}
