/*
 * A YCSB `DB` binding for MongoDB-wire servers on the official Java driver
 * (mongodb-driver-sync 5.x), so YCSB's own client (site.ycsb.Client, its
 * CoreWorkload, zipfian generators and HdrHistogram measurements) drives
 * duetdb. YCSB's mongodb-binding is not on Maven Central; this one keeps its
 * data model and semantics:
 *
 * - records are documents {_id: key, field0..fieldN: binary}; reads find by
 *   _id (projected to the requested fields), updates $set the given fields,
 *   scans find _id >= start sorted by _id with a limit, deletes by _id;
 * - one MongoClient (one connection pool) is shared by every client thread,
 *   made by the first init and closed by the last cleanup;
 * - properties: mongodb.url (default mongodb://localhost:27017/ycsb?w=1;
 *   the database is the URL's path, "ycsb" when it has none; read
 *   preference and write concern come from the URL) and batchsize (inserts
 *   sent as unordered insertMany of that many documents; default 1 = one
 *   insertOne per record, as YCSB's original). Unlike YCSB's binding, a
 *   thread's partial last batch is flushed at cleanup, so a load with
 *   batchsize > 1 inserts every record.
 */
package duet.ycsb;

import com.mongodb.ConnectionString;
import com.mongodb.MongoClientSettings;
import com.mongodb.client.FindIterable;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoClients;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoCursor;
import com.mongodb.client.MongoDatabase;
import com.mongodb.client.model.InsertManyOptions;
import com.mongodb.client.result.DeleteResult;
import com.mongodb.client.result.UpdateResult;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.Vector;
import org.bson.Document;
import org.bson.types.Binary;
import site.ycsb.ByteArrayByteIterator;
import site.ycsb.ByteIterator;
import site.ycsb.DB;
import site.ycsb.DBException;
import site.ycsb.Status;

public class MongoBinding extends DB {
  private static final String DEFAULT_URL = "mongodb://localhost:27017/ycsb?w=1";
  private static final InsertManyOptions UNORDERED = new InsertManyOptions().ordered(false);

  /** Guards the shared client and its reference count. */
  private static final Object LOCK = new Object();
  private static MongoClient client;
  private static MongoDatabase database;
  private static int users;

  private int batchSize = 1;
  private String batchTable;
  private final List<Document> batch = new ArrayList<>();

  @Override
  public void init() throws DBException {
    batchSize = Integer.parseInt(getProperties().getProperty("batchsize", "1"));
    if (batchSize < 1) {
      throw new DBException("batchsize must be at least 1, not " + batchSize);
    }
    synchronized (LOCK) {
      users++;
      if (client != null) {
        return;
      }
      String url = getProperties().getProperty("mongodb.url", DEFAULT_URL);
      try {
        ConnectionString cs = new ConnectionString(url);
        String name = cs.getDatabase();
        if (name == null || name.isEmpty() || name.equals("admin")) {
          name = "ycsb";
        }
        client = MongoClients.create(MongoClientSettings.builder().applyConnectionString(cs).build());
        database = client.getDatabase(name);
      } catch (RuntimeException e) {
        users--;
        throw new DBException("cannot connect with " + url + ": " + e, e);
      }
    }
  }

  @Override
  public void cleanup() throws DBException {
    try {
      flush();
    } catch (RuntimeException e) {
      throw new DBException("flushing the last insert batch: " + e, e);
    } finally {
      synchronized (LOCK) {
        users--;
        if (users == 0 && client != null) {
          client.close();
          client = null;
          database = null;
        }
      }
    }
  }

  private static MongoCollection<Document> coll(String table) {
    return database.getCollection(table);
  }

  private static Document projection(Set<String> fields) {
    Document p = new Document();
    for (String f : fields) {
      p.put(f, 1);
    }
    return p;
  }

  private static void fill(Map<String, ByteIterator> out, Document d) {
    for (Map.Entry<String, Object> e : d.entrySet()) {
      if (e.getValue() instanceof Binary) {
        out.put(e.getKey(), new ByteArrayByteIterator(((Binary) e.getValue()).getData()));
      }
    }
  }

  private static Document fields(Map<String, ByteIterator> values) {
    Document d = new Document();
    for (Map.Entry<String, ByteIterator> e : values.entrySet()) {
      d.put(e.getKey(), e.getValue().toArray());
    }
    return d;
  }

  private void flush() {
    if (!batch.isEmpty()) {
      coll(batchTable).insertMany(new ArrayList<>(batch), UNORDERED);
      batch.clear();
    }
  }

  @Override
  public Status read(String table, String key, Set<String> fields, Map<String, ByteIterator> result) {
    try {
      FindIterable<Document> f = coll(table).find(new Document("_id", key));
      if (fields != null) {
        f.projection(projection(fields));
      }
      Document d = f.first();
      if (d == null) {
        return Status.NOT_FOUND;
      }
      fill(result, d);
      return Status.OK;
    } catch (RuntimeException e) {
      System.err.println("read " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status scan(String table, String startkey, int recordcount, Set<String> fields,
      Vector<HashMap<String, ByteIterator>> result) {
    FindIterable<Document> f = coll(table)
        .find(new Document("_id", new Document("$gte", startkey)))
        .sort(new Document("_id", 1))
        .limit(recordcount);
    if (fields != null) {
      f.projection(projection(fields));
    }
    try (MongoCursor<Document> c = f.iterator()) {
      if (!c.hasNext()) {
        return Status.NOT_FOUND;
      }
      while (c.hasNext()) {
        HashMap<String, ByteIterator> m = new HashMap<>();
        fill(m, c.next());
        result.add(m);
      }
      return Status.OK;
    } catch (RuntimeException e) {
      System.err.println("scan from " + startkey + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status update(String table, String key, Map<String, ByteIterator> values) {
    try {
      UpdateResult r = coll(table).updateOne(new Document("_id", key), new Document("$set", fields(values)));
      return r.wasAcknowledged() && r.getMatchedCount() == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (RuntimeException e) {
      System.err.println("update " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status insert(String table, String key, Map<String, ByteIterator> values) {
    Document d = fields(values);
    d.put("_id", key);
    try {
      if (batchSize == 1) {
        coll(table).insertOne(d);
        return Status.OK;
      }
      if (batchTable != null && !batchTable.equals(table)) {
        flush();
      }
      batchTable = table;
      batch.add(d);
      if (batch.size() < batchSize) {
        return Status.BATCHED_OK;
      }
      flush();
      return Status.OK;
    } catch (RuntimeException e) {
      System.err.println("insert " + key + ": " + e);
      return Status.ERROR;
    }
  }

  @Override
  public Status delete(String table, String key) {
    try {
      DeleteResult r = coll(table).deleteOne(new Document("_id", key));
      return r.wasAcknowledged() && r.getDeletedCount() == 0 ? Status.NOT_FOUND : Status.OK;
    } catch (RuntimeException e) {
      System.err.println("delete " + key + ": " + e);
      return Status.ERROR;
    }
  }
}
